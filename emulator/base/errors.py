"""The one error type for bad user input.

Every parser and checker raises :class:`UserError` for input a person can fix.
The CLI prints its message on one line and exits with status 2; library code
never calls ``sys.exit``.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a config, topology spec, schedule or CLI argument."""

    exit_status = 2


def exact_number(value: float) -> str:
    """``value`` as ``:g`` prints it where that reads back exactly, else in full (specs must rebuild what they
    name)."""
    text = f"{value:g}"
    return text if float(text) == value else repr(value)


#: A value taken from the input is echoed in a message cut to this many characters (its start and end kept).
MAX_SHOWN = 120
#: The command line's last guard: no error line it prints is longer.
MAX_LINE = 2000


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` itself when it has at most ``limit`` characters, else its start and end around `` ... ``: the one
    place a message cuts what it echoes (a 1 MB value given where a name was expected reads in one line)."""
    if len(text) <= limit:
        return text
    tail = max(limit // 4, 1)
    head = max(limit - tail - 5, 1)
    return f"{text[:head]} ... {text[-tail:]}"


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """How a message shows a value the input gave: its ``repr``, printable on one line and cut by :func:`shorten`."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4300 digits
        text = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else "a value too long to show"
    return shorten(printable(text), limit)


def printable(text: object) -> str:
    """``text`` as one printable line: line breaks and other control characters escaped as in ``repr``.

    Where a message embeds names taken from the input (a file path, an
    unknown key), this keeps it on the one line the CLI promises.
    """
    text = str(text)
    return text if text.isprintable() else repr(text)[1:-1]


class FieldError(UserError):
    """A field holds a value that is not what was expected.

    The message reads: ``<where>: field '<field>': expected <expected>, got <given>``. ``given`` is cut to
    :data:`MAX_SHOWN` characters; a reader that explains what it found (a chain of waits it traced, not a value
    echoed from the input) may allow more with ``given_limit``, up to the line's :data:`MAX_LINE`.
    """

    def __init__(self, where: str, field: str, expected: str, given: object, *, given_limit: int = MAX_SHOWN):
        self.where = where
        self.field = field
        self.expected = expected
        self.given = given
        super().__init__(f"{printable(where)}: field '{shorten(printable(field))}': expected {printable(expected)}, "
                         f"got {shown(given, given_limit)}")


def int_field(where: str, name: str, value: object, minimum: int = 0, maximum: int | None = None, *,
              text: bool = False) -> int:
    """``value`` as an integer in ``minimum..maximum``, or :class:`FieldError` naming the field.

    Booleans are never integers here. With ``text``, a string of digits (from
    a ``key=value`` spec or a command line) counts too.
    """
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer in {minimum}..{maximum}"
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text and isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise FieldError(where, name, expected, value)
    return number


class _Missing:
    def __repr__(self) -> str:
        return "nothing"


#: Pass as ``given`` when a required field is absent: the message says "got nothing".
MISSING = _Missing()
