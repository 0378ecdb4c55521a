"""Status codes and the exception a failed call raises."""

import enum


class StatusCode(enum.IntEnum):
    """gRPC's status codes, with gRPC's numbers."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call that did not succeed: .code() is a StatusCode, .details() the
    server's or the library's message.  A handler raises one (or calls
    context.abort) to answer with that status."""

    def __init__(self, code, details=""):
        try:
            code = StatusCode(code)
        except ValueError:
            code = StatusCode.UNKNOWN
        super().__init__(code, details)
        self._code = code
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def __str__(self):
        return f"{self._code.name}: {self._details}" if self._details else self._code.name

    def __repr__(self):
        return f"RpcError({self._code.name}, {self._details!r})"


def _error(code, details):
    """What the C++ core raises."""
    return RpcError(code, details)
