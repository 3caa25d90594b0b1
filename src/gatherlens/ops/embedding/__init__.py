"""The embedding gather: token ids pick rows of a (V, d) table.

    >>> table = torch.randn(10, 6)                          # (V, d)
    >>> get_embeddings(torch.tensor([[3, 1, 4]]), table).shape   # (B, S) -> (B, S, d)
    torch.Size([1, 3, 6])
    >>> embedding_lookup(torch.tensor(7, dtype=torch.int32), table, method="gather").shape
    torch.Size([6])

naive.py is the plain-loop reference; methods.py the equivalent formulations (METHODS); fast.py
the default; checks.py the validation and `bounds=` policies; module.py the nn.Module.
"""
from gatherlens.ops.embedding.checks import BOUNDS, OutOfVocabularyWarning
from gatherlens.ops.embedding.lookup import embedding_lookup, get_embeddings
from gatherlens.ops.embedding.methods import DEFAULT_METHOD, METHODS
from gatherlens.ops.embedding.module import Embedding
from gatherlens.ops.embedding.naive import naive_lookup

__all__ = ["get_embeddings", "embedding_lookup", "Embedding", "METHODS", "DEFAULT_METHOD", "BOUNDS",
           "OutOfVocabularyWarning", "naive_lookup"]
