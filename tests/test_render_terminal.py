"""Terminal view with rich: colours from the layout, labels printed literally."""
import torch
from rich.console import Console

from gatherlens.render.theme import PALETTE
from gatherlens.trace import record_embedding, record_gather


def _console():
    return Console(record=True, width=200, color_system="truecolor", force_terminal=True)


def test_terminal_shows_grids_and_literal_labels():
    rec = record_embedding(torch.tensor([[3, 1]]), torch.arange(20.0).view(5, 4),
                           labels=["[b]x[/b]", "<b>"])
    con = _console()
    rec.print_terminal(console=con)
    text = con.export_text(styles=False, clear=False)
    assert "[b]x[/b]" in text and "<b>" in text
    assert "W[ids]" in text and "(V, d) = (5, 4)" in text and "3:12" in text
    styled = con.export_text(styles=True)
    r, g, b = (int(PALETTE[3][i:i + 2], 16) for i in (1, 3, 5))
    assert f"48;2;{r};{g};{b}" in styled  # row 3's colour as a background


def test_terminal_zh():
    rec = record_gather(torch.arange(6.0).view(2, 3), 1, torch.tensor([[2], [0]]))
    con = _console()
    rec.print_terminal(lang="zh", console=con)
    assert "源张量" in con.export_text()
