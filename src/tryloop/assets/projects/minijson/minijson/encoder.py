"""Writing Python values as JSON text."""

import math

from minijson.lexer import ESCAPES

# Character -> its escape sequence; '/' is never escaped on output.
ENCODE = {char: "\\" + esc for esc, char in ESCAPES.items() if esc != "/"}


def encode_string(s, ensure_ascii=True):
    out = ['"']
    for ch in s:
        if ch in ENCODE:
            out.append(ENCODE[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        elif ensure_ascii and ord(ch) > 126:
            code = ord(ch)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def encode_float(x):
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"{x!r} is not allowed in JSON")
    return repr(x)


class Encoder:
    def __init__(self, indent=None, sort_keys=False, ensure_ascii=True):
        self.indent = indent
        self.sort_keys = sort_keys
        self.ensure_ascii = ensure_ascii
        self.active = set()

    def encode(self, obj, level=0):
        if obj is None:
            return "null"
        if obj is True:
            return "true"
        if obj is False:
            return "false"
        if isinstance(obj, int):
            return str(obj)
        if isinstance(obj, float):
            return encode_float(obj)
        if isinstance(obj, str):
            return encode_string(obj, self.ensure_ascii)
        if isinstance(obj, (list, tuple)):
            return self.container(obj, level, "[", "]", [self.encode_item(v, level + 1) for v in obj])
        if isinstance(obj, dict):
            keys = sorted(obj) if self.sort_keys else list(obj)
            for key in keys:
                if not isinstance(key, str):
                    raise TypeError(f"keys must be strings, not {type(key).__name__}")
            return self.container(obj, level, "{", "}", [
                encode_string(k, self.ensure_ascii) + ": " + self.encode_item(obj[k], level + 1) for k in keys])
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")

    def encode_item(self, value, level):
        if isinstance(value, (list, tuple, dict)):
            if id(value) in self.active:
                raise ValueError("circular reference")
            self.active.add(id(value))
            try:
                return self.encode(value, level)
            finally:
                self.active.discard(id(value))
        return self.encode(value, level)

    def container(self, obj, level, open_, close, parts):
        if not parts:
            return open_ + close
        if self.indent is None:
            return open_ + ", ".join(parts) + close
        inner = "\n" + " " * (self.indent * (level + 1))
        outer = "\n" + " " * (self.indent * level)
        return open_ + inner + ("," + inner).join(parts) + outer + close


def dumps(obj, indent=None, sort_keys=False, ensure_ascii=True):
    """JSON text for `obj`, laid out as the standard library's json.dumps lays it out."""
    return Encoder(indent, sort_keys, ensure_ascii).encode_item(obj, 0)
