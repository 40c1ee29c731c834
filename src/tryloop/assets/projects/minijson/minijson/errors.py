"""Errors that say where in the text they happened."""


def line_col(text, pos):
    """1-based (line, column) of offset `pos` in `text`; a newline ends its line."""
    line = text.count("\n", 0, pos) + 1
    last_newline = text.rfind("\n", 0, pos)
    col = pos - last_newline
    return line, col


class JSONError(ValueError):
    """A syntax error in a JSON document, with the offset, line and column where it was found."""

    def __init__(self, msg, text, pos):
        self.msg = msg
        self.pos = pos
        self.line, self.col = line_col(text, pos)
        super().__init__(f"{msg} at line {self.line} column {self.col} (char {pos})")
