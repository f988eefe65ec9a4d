"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the right status code."""

from __future__ import annotations

from http import HTTPStatus

from starlette.responses import JSONResponse

# OpenAI's error types by status; clients (and the openai package) map the status code to an exception class.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """Raised anywhere in a handler; turned into an OpenAI-shaped JSON error response."""

    def __init__(
        self,
        message: str,
        status_code: int = 400,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,  # noqa: A002 - OpenAI's field name
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status_code, "server_error" if status_code >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status_code == 401 else None
        return JSONResponse(self.body(), status_code=self.status_code, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(message, 400, param=param, code=code)


def internal_error(exc: BaseException) -> APIError:
    """A 500 that names what broke without leaking a traceback (that goes to the log)."""
    detail = str(exc) or type(exc).__name__
    return APIError(
        f"Internal server error ({type(exc).__name__}: {detail}). The server is still running; the details are "
        "in its log (stderr). If this repeats, please report it with that log.",
        500,
        type="server_error",
    )


def http_status_error(status_code: int, detail: str | None = None) -> APIError:
    """Starlette's own errors (unknown route, wrong method) in the same shape."""
    phrase = HTTPStatus(status_code).phrase if status_code in HTTPStatus._value2member_map_ else "Error"
    message = detail if detail and detail != phrase else phrase
    if status_code == 404:
        message = f"{message}: no such route. The API lives under /v1 (e.g. /v1/chat/completions, /v1/models)."
    return APIError(message, status_code)
