"""Ollama's HTTP API served beside the OpenAI one (routes.py), translated onto the OpenAI handlers
(convert.py)."""
