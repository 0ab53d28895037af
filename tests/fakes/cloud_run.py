"""A local stand-in for the functions' front door (Cloud Run, behind each function's URL):
`GET /NAME` answers `answers[NAME]`, as the deployed function (or Cloud Run's IAM, for a
private one) answers a call without credentials; any other path answers Google's 404 page.
tests/functions/test_doctor.py checks the real functions give the statuses the tests put here.
"""

from __future__ import annotations

from tests.fakes.local_server import LocalServer, QuietHandler

FORBIDDEN_PAGE = b"<html><head><title>403 Forbidden</title></head><body><h1>Error: Forbidden</h1></body></html>"
NOT_FOUND_PAGE = (
    b"<html><head><title>404 Page not found</title></head><body><h1>Error: Page not found</h1></body></html>"
)


class FakeCloudRun:
    def __init__(self) -> None:
        self.answers: dict[str, int] = {}
        self.calls: list[tuple[str, str | None]] = []  # (path, Authorization header)
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                fake.calls.append((self.path, self.headers.get("Authorization")))
                status = fake.answers.get(self.path.strip("/"))
                if status is None:
                    return self.answer_bytes(404, NOT_FOUND_PAGE, "text/html")
                if status == 403:
                    return self.answer_bytes(403, FORBIDDEN_PAGE, "text/html")
                error = {401: "unauthorized", 405: "method_not_allowed", 503: "not_configured"}.get(status, "error")
                self.answer_json(status, {"error": error, "message": f"the function's {status}"})

        return Handler
