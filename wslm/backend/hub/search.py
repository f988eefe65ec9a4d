"""`wslm models search`: find models on the hub (or the mirror) that the engine can run, with their files.

Uses the hub's public API: GET /api/models?search=Q (the list) and GET /api/models/{repo}?blobs=true (the
files with sizes). Only text-generation repos with GGUF or safetensors weights are kept."""

from __future__ import annotations

import httpx

from wslm.backend.hub.hf_cache import hub_endpoint
from wslm.backend.hub.quant import is_model_gguf, quant_label


def search_models(query: str, endpoint: str | None = None, limit: int = 20, token: str | None = None,
                  timeout: float = 15.0) -> list[dict]:
    """[{"id", "downloads", "likes", "files": [{"name", "size_bytes", "quantization", "format"}],
    "total_bytes"}] best match first."""
    base = hub_endpoint(endpoint)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=timeout, headers=headers, follow_redirects=True) as client:
        resp = client.get(f"{base}/api/models", params={"search": query, "limit": limit,
                                                        "pipeline_tag": "text-generation"})
        resp.raise_for_status()
        out = []
        for item in resp.json()[:limit]:
            repo = item.get("id") or item.get("modelId")
            if not repo:
                continue
            info = client.get(f"{base}/api/models/{repo}", params={"blobs": "true"})
            if info.status_code != 200:
                continue
            files = _weight_files(info.json().get("siblings") or [])
            if files:
                out.append({"id": repo, "downloads": int(item.get("downloads") or 0),
                            "likes": int(item.get("likes") or 0), "files": files,
                            "total_bytes": sum(f["size_bytes"] for f in files)})
    return out


def _weight_files(siblings: list[dict]) -> list[dict]:
    """GGUF files one by one (each is a choice); safetensors as one entry (the whole checkpoint)."""
    ggufs = [{"name": s["rfilename"], "size_bytes": int(s.get("size") or 0), "format": "gguf",
              "quantization": quant_label(s["rfilename"]) or ""}
             for s in siblings if is_model_gguf(s.get("rfilename", ""))]
    tensors = [s for s in siblings if s.get("rfilename", "").endswith(".safetensors")]
    if tensors:
        ggufs.append({"name": "*.safetensors", "size_bytes": sum(int(s.get("size") or 0) for s in tensors),
                      "format": "hf", "quantization": ""})
    return ggufs
