"""`lowbit serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one LLM. Needs the extra
`pip install 'lowbit[serve]'`; docs/serving.md lists the endpoints and flags."""
from __future__ import annotations

from typing import Any


def serve(llm, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          api_key: str | None = None, max_seqs: int = 64, max_queue: int = 256, log_level: str = "info") -> None:
    """Serves `llm` (created with step_thread=True) until interrupted."""
    import uvicorn

    from .app import create_app
    app = create_app(llm, model_name or default_model_name(llm), api_key=api_key, max_seqs=max_seqs,
                     max_queue=max_queue)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def default_model_name(llm: Any) -> str:
    from pathlib import Path
    source = str(llm.source)
    return Path(source).stem if source else "lowbit"
