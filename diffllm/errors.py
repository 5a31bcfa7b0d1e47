"""UserError: the one exception type that means "the user's input is wrong" (a config key or value, a file, a
checkpoint or data state). Every command turns it into one line on stderr naming the culprit and exit code 2; any other
exception is a bug and keeps its traceback. It subclasses ValueError so that callers that catch ValueError still
catch it; DataError (diffllm.data) and EvalError (diffllm.eval) are UserErrors."""


class UserError(ValueError):
    """Bad input: the message is one line naming the key or file and the problem."""
