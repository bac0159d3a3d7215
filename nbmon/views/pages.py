"""The offline pages nbmon writes: one skeleton, one plotly embedding, one
way to the disk (:func:`nbmon.sinks.files.write_text`: never through a planted
link). A run's page (``nbmon run --html``, :func:`nbmon.views.dashboard.write_html`)
and a distributed job's ranks (``nbmon report --html``, :func:`ranks_figure`)
are both :func:`write_page`: a title, the static record or tables, then an
interactive chart with plotly.js embedded, so that the page opens offline.
"""
from __future__ import annotations

import html

from .. import catalog
from ..sinks import files
from .charts import PALETTE, ROWS
from .frames import minmax_indices


def page(title: str, body: str, figure=None) -> str:
    """A whole HTML page: ``title`` (text) as its title and heading,
    ``body`` (HTML), then ``figure`` (a plotly figure, None: none) with
    plotly.js embedded."""
    plot = ""
    if figure is not None:
        import plotly.io as pio

        plot = pio.to_html(figure, include_plotlyjs=True, full_html=False, config={"displaylogo": False})
    name = html.escape(title)
    return ('<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<title>nbmon: {name}</title></head>'
            '<body style="font-family:system-ui,sans-serif;margin:16px">'
            f'<h3 style="margin:0 0 8px">nbmon: {name}</h3>{body}{plot}</body></html>\n')


def write_page(path, title: str, body: str, figure=None, *, overwrite: bool = False):
    """Write :func:`page` to ``path``; returns ``path``. An existing name is
    FileExistsError unless ``overwrite``, which replaces the name, never
    what a link there points to (:mod:`nbmon.sinks.files`)."""
    files.write_text(path, page(title, body, figure), overwrite=overwrite)
    return path


def ranks_figure(frame, points_per_trace: int = 2000):
    """One timeline per chart row the ranks have, a trace per rank (x: the
    job's common ``elapsed_s``), each reduced to ``points_per_trace`` by
    min/max decimation."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [row for row in ROWS if row.headline in frame.columns and frame[row.headline].notna().any()]
    fig = make_subplots(rows=max(1, len(rows)), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[f"{row.short} {catalog.unit_of(row.headline)}" for row in rows])
    for k, (rank, part) in enumerate(frame.groupby("rank", sort=True)):
        part = part.sort_values("elapsed_s")
        host = part["host"].iloc[0]
        for r, row in enumerate(rows, start=1):
            x = part["elapsed_s"].to_numpy(dtype=float)
            y = part[row.headline].to_numpy(dtype=float)
            idx = minmax_indices(y, points_per_trace)
            if idx is not None:
                x, y = x[idx], y[idx]
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", name=f"rank {rank}", legendgroup=str(rank), showlegend=r == 1,
                line={"width": 1.2, "color": PALETTE[k % len(PALETTE)]},
                hovertemplate=f"%{{y:.1f}} {catalog.unit_of(row.headline)}<extra>rank {rank}"
                              f"{' · ' + html.escape(str(host)) if host else ''}</extra>"), row=r, col=1)
    fig.update_xaxes(title_text="seconds since the job's first sample", row=max(1, len(rows)), col=1)
    fig.update_layout(height=120 + 200 * max(1, len(rows)), template="plotly_white", hovermode="closest",
                      margin={"l": 60, "r": 20, "t": 40, "b": 40})
    return fig
