"""TF-IDF weights, cosine similarity and a small search index."""

import math

from textstats.ngrams import count_ngrams
from textstats.tokens import remove_stopwords, tokenize


def term_frequency(tokens):
    """Share of the tokens taken by each term: counts divided by the number of tokens."""
    if not tokens:
        return {}
    counts = count_ngrams(tokens, 1)
    total = len(tokens)
    return {gram[0]: c / total for gram, c in counts.items()}


def idf(term, documents):
    """Smoothed inverse document frequency: ln((1 + N) / (1 + df)) + 1, where `documents` is a
    list of token lists and df the number of documents that contain `term`."""
    df = sum(1 for doc in documents if term in doc)
    return math.log((1 + len(documents)) / (1 + df)) + 1


def tfidf(tokens, documents):
    """TF-IDF weight of every term of `tokens` against the collection `documents`."""
    return {term: tf * idf(term, documents) for term, tf in term_frequency(tokens).items()}


def cosine(a, b):
    """Cosine similarity of two sparse vectors (dicts); 0.0 if either is all zeros."""
    dot = sum(weight * b[key] for key, weight in a.items() if key in b)
    norm_a = math.sqrt(sum(w * w for w in a.values()))
    norm_b = math.sqrt(sum(w * w for w in b.values()))
    if norm_a == 0 or norm_b == 0:
        return 0.0
    return dot / (norm_a * norm_b)


class Index:
    """Documents indexed by id; `search` ranks them against a query by TF-IDF cosine."""

    def __init__(self, stopwords=True):
        self.stopwords = stopwords
        self.docs = {}

    def _terms(self, text):
        tokens = tokenize(text)
        return remove_stopwords(tokens) if self.stopwords else tokens

    def add(self, doc_id, text):
        if doc_id in self.docs:
            raise KeyError(f"duplicate document id {doc_id!r}")
        self.docs[doc_id] = self._terms(text)

    def __len__(self):
        return len(self.docs)

    def vocabulary(self):
        """Every indexed term, sorted."""
        return sorted({t for terms in self.docs.values() for t in terms})

    def search(self, query, k=3):
        """The best `k` (doc_id, score) pairs with a positive score, best first, ties by id."""
        collection = list(self.docs.values())
        q = tfidf(self._terms(query), collection)
        results = []
        for doc_id, terms in self.docs.items():
            score = cosine(q, tfidf(terms, collection))
            if score > 0:
                results.append((doc_id, score))
        results.sort(key=lambda pair: (-pair[1], pair[0]))
        return results[:k]
