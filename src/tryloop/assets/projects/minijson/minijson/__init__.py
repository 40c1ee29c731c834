"""A small JSON reader and writer."""

from minijson.encoder import dumps
from minijson.errors import JSONError, line_col
from minijson.lexer import Token, tokenize
from minijson.parser import loads

__all__ = ["JSONError", "Token", "dumps", "line_col", "loads", "tokenize"]
