"""Tokenizing, n-gram counting and TF-IDF ranking over small document collections."""

from textstats.ngrams import char_ngrams, count_ngrams, most_common, ngrams
from textstats.ranking import Index, cosine, idf, term_frequency, tfidf
from textstats.tokens import STOPWORDS, remove_stopwords, sentences, tokenize

__all__ = [
    "STOPWORDS", "Index", "char_ngrams", "cosine", "count_ngrams", "idf", "most_common", "ngrams",
    "remove_stopwords", "sentences", "term_frequency", "tfidf", "tokenize",
]
