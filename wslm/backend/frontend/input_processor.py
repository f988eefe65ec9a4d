"""InputProcessor: a request made ready for the engine core, once: the chat rendered, the prompt tokenized and
truncated, every limit checked, the grammar compiled, the token rules built.

It only reads the tokenizer, the template and the (thread-safe) grammar compiler, so the server runs it in a
worker thread, off both the event loop and the engine thread; LLM runs it inline. Both get the same
EngineRequest from the same input."""

from __future__ import annotations

import time
from typing import Any

from wslm.backend.engine.core import EngineRequest
from wslm.backend.errors import RequestError
from wslm.backend.frontend.chat import images_refused, read_template, render_chat
from wslm.backend.frontend.validation import RequestLimits, validate_prompt
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.structured.compiler import StructuredOutputCompiler
from wslm.backend.worker.token_rules import TokenRules


class InputProcessor:
    def __init__(self, tokenizer, limits: RequestLimits, structured: StructuredOutputCompiler | None,
                 chat_template: str | None, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.limits = limits  # the server replaces it with one carrying its stop-list flags
        self.structured = structured
        self.chat_template = read_template(chat_template)
        self.model_name = model_name
        self.vision = None  # a vision model's VisionPrompts (vision_prompts.py): images in chat
        self.lora_checker: Any = None  # lora.checks.AdapterChecker (LLMEngine sets it): a request's adapter

    def render_chat(self, messages: list[dict], chat_template: str | None = None, add_generation_prompt: bool = True,
                    **options: Any) -> list[int]:
        """The prompt ids for a chat (chat.render_chat: the one path LLM.chat and the server share); options:
        continue_final_message, tools, chat_template_kwargs."""
        template = read_template(chat_template) or self.chat_template
        if template is None and self.vision is not None and not getattr(self.tokenizer, "chat_template", None):
            template = self.vision.chat_template
        return render_chat(self.tokenizer, messages, template, add_generation_prompt, self.model_name,
                           vision=self.vision, **options)

    def process(self, request_id: str, prompt: str | list[int] | dict, params: SamplingParams | None = None,
                arrival_time: float | None = None, what: str = "prompt",
                structured_param: str | None = None, lora_request: Any = None) -> EngineRequest:
        """Raises RequestError (a ValueError carrying OpenAI's param and code) when the request cannot be
        served. what: the request field the prompt came from (named in errors); structured_param: the field
        the grammar came from (response_format, tools, structured_outputs)."""
        arrival = time.monotonic() if arrival_time is None else arrival_time
        # A private copy: validation fills in max_tokens, and callers may share one params object.
        params = params.clone() if params is not None else SamplingParams()
        prompt, images = self._images(prompt, what)
        if params.truncate_prompt_tokens is not None:
            if images:
                raise RequestError("truncate_prompt_tokens cannot cut a prompt that carries images.",
                                   param="truncate_prompt_tokens")
            prompt = self.truncate(prompt, params.truncate_prompt_tokens, params.truncation_side)
        text, ids = validate_prompt(prompt, params, self.tokenizer, self.limits, what)
        if self.vision is not None and not images and self.vision.image_token_id in ids:
            raise RequestError(f"The prompt holds the image placeholder token (id {self.vision.image_token_id}) but "
                               "no image: send images as image_url parts of a chat message.", param=what)
        grammar = None
        if params.structured_outputs is not None:
            if self.structured is None:
                raise RequestError("This engine serves an embedding model: it has no structured output.")
            try:
                grammar = self.structured.compile(params.structured_outputs)
            except RequestError as exc:
                exc.param = structured_param or exc.param or "structured_outputs"
                exc.code = exc.code or "invalid_structured_output"
                raise
        rules = TokenRules.build(params, self.tokenizer)
        if lora_request is not None:
            if self.lora_checker is None:
                raise RequestError("This engine serves no LoRA adapters.", param="lora_request")
            self.lora_checker(lora_request)
        return EngineRequest(request_id, text, ids, params, arrival, grammar, rules, images=images,
                             lora_request=lora_request)

    def _images(self, prompt: Any, what: str) -> tuple[Any, tuple]:
        """The prompt's images: a rendered chat's PromptIds carries them; vLLM's offline form
        {"prompt": text, "multi_modal_data": {"image": PIL image(s)}} has its text's placeholders expanded here."""
        ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else prompt
        images = getattr(ids, "images", ())
        if images:
            return list(ids), images
        if isinstance(prompt, dict) and prompt.get("multi_modal_data"):
            mm = prompt["multi_modal_data"]
            if self.vision is None:
                raise images_refused(self.model_name, what)
            if not isinstance(mm, dict) or set(mm) - {"image"} or not isinstance(prompt.get("prompt"), str):
                raise RequestError('multi_modal_data takes {"image": image or [images]} beside a text "prompt".',
                                   param=what)
            from wslm.backend.frontend.images import LoadedImage, check_count, pil_image

            items = mm["image"] if isinstance(mm["image"], (list, tuple)) else [mm["image"]]
            check_count(len(items), self.vision.limits)
            loaded: list[LoadedImage] = [pil_image(im, self.vision.limits, f"{what}.multi_modal_data.image.{i}")
                                         for i, im in enumerate(items)]
            ids = self.vision.prompt(prompt["prompt"], loaded)
            return list(ids), ids.images
        return prompt, ()

    def process_pooling(self, request_id: str, prompt: Any, params: PoolingParams,
                        arrival_time: float | None = None) -> EngineRequest:
        """An embedding request of a decoder model: its prompt checked as a generation prompt of one token."""
        arrival = time.monotonic() if arrival_time is None else arrival_time
        text, ids = validate_prompt(prompt, SamplingParams(max_tokens=1), self.tokenizer, self.limits)
        return EngineRequest(request_id, text, ids, params.clone(), arrival)

    def truncate(self, prompt: str | list[int] | dict, keep: int, side: str | None = None) -> str | list[int] | dict:
        """truncate_prompt_tokens (vLLM's): keep the last `keep` tokens (-1: as many as the context holds), or
        the first ones with truncation_side "right"."""
        if keep == -1:
            keep = self.limits.max_model_len - 1
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt if isinstance(prompt, str) else None
        if isinstance(text, str):
            ids = self.tokenizer.encode(text)
        elif isinstance(prompt, dict):
            ids = prompt.get("prompt_token_ids")
        else:
            ids = prompt
        if not isinstance(ids, (list, tuple)) or len(ids) <= keep:
            return prompt
        return {"prompt_token_ids": list(ids)[:keep] if side == "right" else list(ids)[-keep:]}
