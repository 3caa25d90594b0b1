"""Records of what a gather picked: the data every picture is drawn from.

    >>> rec = record_embedding(torch.tensor([[3, 1, 4]]), torch.randn(10, 6))
    >>> rec.to_svg()

Builders run the real op and record, for every output element, the source element it came from.
`as_record(selection)` turns what an op returned (an AttentionSelection, a PageSelection) into one.
"""
from gatherlens.trace.builders import (
    record_attention_selection,
    record_embedding,
    record_gather,
    record_index_select,
    record_indexing,
    record_take_along_dim,
)
from gatherlens.trace.convert import as_record
from gatherlens.trace.diagnose import (
    GatherDiagnosticWarning,
    GatherFinding,
    diagnose_gather,
    explain_ndim_mismatch,
)
from gatherlens.trace.page_trace import PageTrace, PageTraceRecorder
from gatherlens.trace.pages import record_page_selection
from gatherlens.trace.record import GatherRecord
from gatherlens.trace.sampling import record_sampling
from gatherlens.trace.tracer import TraceEvent, trace

__all__ = [
    "GatherRecord",
    "as_record",
    "record_gather",
    "record_index_select",
    "record_indexing",
    "record_take_along_dim",
    "record_embedding",
    "record_attention_selection",
    "diagnose_gather",
    "GatherFinding",
    "GatherDiagnosticWarning",
    "explain_ndim_mismatch",
    "record_page_selection",
    "record_sampling",
    "PageTrace",
    "PageTraceRecorder",
    "trace",
    "TraceEvent",
]
