"""Turning JSON text into tokens."""

from dataclasses import dataclass

from minijson.errors import JSONError

PUNCTUATION = "{}[]:,"
LITERALS = {"true": True, "false": False, "null": None}
WHITESPACE = " \t\n\r"
# Escape letter after a backslash -> the character it stands for.
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


@dataclass(frozen=True)
class Token:
    """kind: one of PUNCTUATION, 'string', 'number', 'literal' or 'eof'; pos: offset of its first character."""

    kind: str
    value: object
    pos: int


def tokenize(text):
    """All tokens of `text`, ending with an 'eof' token. Raises JSONError on bad input."""
    tokens = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in WHITESPACE:
            i += 1
        elif ch in PUNCTUATION:
            tokens.append(Token(ch, ch, i))
            i += 1
        elif ch == '"':
            value, end = read_string(text, i)
            tokens.append(Token("string", value, i))
            i = end
        elif ch == "-" or ch.isdigit():
            value, end = read_number(text, i)
            tokens.append(Token("number", value, i))
            i = end
        elif ch.isalpha():
            j = i
            while j < n and text[j].isalpha():
                j += 1
            word = text[i:j]
            if word not in LITERALS:
                raise JSONError(f"unknown literal {word!r}", text, i)
            tokens.append(Token("literal", LITERALS[word], i))
            i = j
        else:
            raise JSONError(f"unexpected character {ch!r}", text, i)
    tokens.append(Token("eof", None, n))
    return tokens


def read_string(text, start):
    """Decode the string literal whose opening quote is at `start`; returns (value, end offset)."""
    out = []
    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\":
            if i + 1 >= n:
                break
            esc = text[i + 1]
            if esc == "u":
                code = read_hex4(text, i + 2)
                i += 6
                if 0xD800 <= code < 0xDC00 and text.startswith("\\u", i):
                    low = read_hex4(text, i + 2)
                    if 0xDC00 <= low < 0xE000:
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        i += 6
                out.append(chr(code))
                continue
            if esc not in ESCAPES:
                raise JSONError(f"invalid escape '\\{esc}'", text, i)
            out.append(ESCAPES[esc])
            i += 2
        elif ch < " ":
            raise JSONError("control character in string", text, i)
        else:
            out.append(ch)
            i += 1
    raise JSONError("unterminated string", text, start)


def read_hex4(text, i):
    digits = text[i:i + 4]
    if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise JSONError("bad \\u escape", text, i - 2)
    return int(digits, 16)


def read_number(text, start):
    """Read -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at `start`; returns (int or float, end)."""
    i = start
    n = len(text)
    if text[i] == "-":
        i += 1
    if i < n and text[i] == "0":
        i += 1
    elif i < n and text[i].isdigit():
        while i < n and text[i].isdigit():
            i += 1
    else:
        raise JSONError("expected digit", text, i)
    is_float = False
    if i < n and text[i] == ".":
        i += 1
        if not (i < n and text[i].isdigit()):
            raise JSONError("expected digit after '.'", text, i)
        while i < n and text[i].isdigit():
            i += 1
        is_float = True
    if i < n and text[i] in "eE":
        i += 1
        if i < n and text[i] in "+-":
            i += 1
        if not (i < n and text[i].isdigit()):
            raise JSONError("expected digit in exponent", text, i)
        while i < n and text[i].isdigit():
            i += 1
        is_float = True
    literal = text[start:i]
    return (float(literal) if is_float else int(literal)), i
