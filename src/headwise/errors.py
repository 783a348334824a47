"""The two kinds of failure the command line distinguishes."""


class HeadwiseError(Exception):
    """Bad input from the user: the CLI prints the message on one line and exits with status 2."""


class RunFailure(Exception):
    """A failure while running (diverged loss, crashed worker): the CLI exits with status 1."""
