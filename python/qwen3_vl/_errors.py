"""The package's exceptions: every error it raises is a `qwen3_vl.Error`."""


class Error(Exception):
    """An error of qwen3_vl; `message` is its text."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class LoadError(Error):
    """The model could not be checked or loaded (a missing file, a bad option, no GPU memory
    left, ...): the message names the file or the option."""


class RequestError(Error):
    """A request was refused or failed, as `qwen3-vl serve` would answer it: `status` (400 for a
    bad request, 500 when generation failed, 503 once the model is closed), `code` (a stable
    machine-readable code such as `invalid_value`), `param` (the field at fault, such as
    `messages[0].content[1].image_url`, or None) and `type` (`invalid_request_error`, ...)."""

    def __init__(self, message, status=400, code="invalid_value", param=None, type="invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.type = type

    def to_dict(self):
        """The error object `serve` sends: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __str__(self):
        return f"{self.message} (param: {self.param})" if self.param else self.message

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.code, self.param, self.type))
