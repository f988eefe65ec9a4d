"""The OpenAI-compatible HTTP server behind `wslm serve` (FastAPI + uvicorn), shaped after vLLM's.

app.build_app() wires the routes; async_engine.AsyncEngine owns the engine from one thread; launcher.run()
binds the port, loads the model and prints the JSON status lines the GUI waits on."""
