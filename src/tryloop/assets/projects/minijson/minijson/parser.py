"""A recursive-descent parser over the tokens of minijson.lexer."""

from minijson.errors import JSONError
from minijson.lexer import tokenize


class Parser:
    def __init__(self, text, max_depth=100):
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0
        self.depth = 0
        self.max_depth = max_depth

    def peek(self):
        return self.tokens[self.index]

    def advance(self):
        token = self.tokens[self.index]
        self.index += 1
        return token

    def error(self, msg, token):
        return JSONError(msg, self.text, token.pos)

    def expect(self, kind):
        token = self.advance()
        if token.kind != kind:
            raise self.error(f"expected {kind!r}", token)
        return token

    def parse(self):
        value = self.value()
        token = self.peek()
        if token.kind != "eof":
            raise self.error("extra data after value", token)
        return value

    def value(self):
        token = self.peek()
        if token.kind == "{":
            return self.nested(self.obj, token)
        if token.kind == "[":
            return self.nested(self.array, token)
        if token.kind in ("string", "number", "literal"):
            self.advance()
            return token.value
        if token.kind == "eof":
            raise self.error("unexpected end of input", token)
        raise self.error(f"unexpected {token.kind!r}", token)

    def nested(self, parse, token):
        self.depth += 1
        if self.depth > self.max_depth:
            raise self.error("nesting too deep", token)
        try:
            return parse()
        finally:
            self.depth -= 1

    def obj(self):
        self.expect("{")
        result = {}
        if self.peek().kind == "}":
            self.advance()
            return result
        while True:
            key = self.advance()
            if key.kind != "string":
                raise self.error("expected string key", key)
            self.expect(":")
            result[key.value] = self.value()
            sep = self.advance()
            if sep.kind == "}":
                return result
            if sep.kind != ",":
                raise self.error("expected ',' or '}'", sep)
            if self.peek().kind == "}":
                raise self.error("trailing comma", self.peek())

    def array(self):
        self.expect("[")
        result = []
        if self.peek().kind == "]":
            self.advance()
            return result
        while True:
            result.append(self.value())
            sep = self.advance()
            if sep.kind == "]":
                return result
            if sep.kind != ",":
                raise self.error("expected ',' or ']'", sep)
            if self.peek().kind == "]":
                raise self.error("trailing comma", self.peek())


def loads(text, max_depth=100):
    """Parse one JSON document. Duplicate keys: the last one wins."""
    return Parser(text, max_depth).parse()
