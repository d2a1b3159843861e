"""Small charts drawn on the server as inline SVG: no JavaScript, no CDN, readable without CSS;
and the one way the admin pages write an age."""

from datetime import timedelta

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

BAR_COLOR = "#417690"  # the admin's own header blue
EMPTY_COLOR = "#ccc"


def bar_chart(
    items: list[tuple[str, int]],
    *,
    title: str,
    width: int = 420,
    bar_height: int = 18,
    label_width: int = 150,
) -> SafeString:
    """Horizontal bars, one per (label, value), with the value written at each bar's end.

    The SVG carries a ``<title>`` and each bar an ``aria-label`` so screen readers and text
    browsers get the same numbers; an empty series says so instead of drawing nothing.
    """
    if not items:
        return format_html('<p class="help">{}: no data.</p>', title)
    gap = 6
    value_width = 60
    plot = max(width - label_width - value_width, 40)
    height = len(items) * (bar_height + gap) + gap
    rows = _bar_rows(items, plot=plot, gap=gap, bar_height=bar_height, label_width=label_width)
    body = format_html_join(
        "",
        '<text x="{1}" y="{0}" text-anchor="end" font-size="12">{2}</text>'
        '<rect aria-label="{3}" x="{4}" y="{5}" width="{6}" height="{7}" fill="{8}"></rect>'
        '<text x="{9}" y="{10}" font-size="12">{11}</text>',
        rows,
    )
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{}" height="{}" '
        'viewBox="0 0 {} {}" class="triage-chart"><title>{}</title>{}</svg>',
        width,
        height,
        width,
        height,
        title,
        body,
    )


def _bar_rows(
    items: list[tuple[str, int]], *, plot: int, gap: int, bar_height: int, label_width: int
) -> list[tuple]:
    """One row of SVG coordinates per bar, in the order ``bar_chart``'s template reads them."""
    peak = max(value for _, value in items) or 1
    rows = []
    for i, (label, value) in enumerate(items):
        y = gap + i * (bar_height + gap)
        length = round(plot * value / peak) if value else 0
        rows.append(
            (
                y + bar_height * 0.72,
                label_width - 6,
                label[:28],
                f"{label}: {value}",
                label_width,
                y,
                max(length, 1),
                bar_height,
                BAR_COLOR if value else EMPTY_COLOR,
                label_width + max(length, 1) + 4,
                y + bar_height * 0.72,
                value,
            )
        )
    return rows


def ratio_bar(part: int, total: int, *, title: str, width: int = 420) -> SafeString:
    """One bar showing part / total, labelled with both numbers and the percentage."""
    if not total:
        return format_html('<p class="help">{}: no messages in the window.</p>', title)
    share = part / total
    filled = round((width - 2) * share)
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{}" height="40" '
        'viewBox="0 0 {} 40" class="triage-chart"><title>{}</title>'
        '<rect x="1" y="1" width="{}" height="20" fill="#eee" stroke="#999"></rect>'
        '<rect x="1" y="1" width="{}" height="20" fill="{}"></rect>'
        '<text x="1" y="36" font-size="12">{} of {} ({}%)</text></svg>',
        width,
        width,
        title,
        width - 2,
        filled,
        "#ba2121" if share > 0.05 else BAR_COLOR,
        part,
        total,
        f"{share * 100:.1f}",
    )


def threshold_bar(
    closeness: float, *, warning: float, title: str, width: int = 160, height: int = 14
) -> SafeString:
    """A small bar for how close a rate is to its threshold: full width is 125 % of it.

    Tick marks at the warning level and at the threshold; the bar is blue under the warning,
    orange from it, red from the threshold. The ``<title>`` carries the numbers in words.
    """
    scale = 1.25
    share = max(0.0, min(closeness, scale)) / scale
    filled = round((width - 2) * share)
    color = "#ba2121" if closeness >= 1 else "#ff9900" if closeness >= warning else BAR_COLOR
    warn_x = 1 + round((width - 2) * warning / scale)
    limit_x = 1 + round((width - 2) / scale)
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{}" height="{}" '
        'viewBox="0 0 {} {}" class="triage-chart"><title>{}</title>'
        '<rect x="1" y="1" width="{}" height="{}" fill="#eee" stroke="#999"></rect>'
        '<rect x="1" y="1" width="{}" height="{}" fill="{}"></rect>'
        '<line x1="{}" y1="0" x2="{}" y2="{}" stroke="#ff9900"></line>'
        '<line x1="{}" y1="0" x2="{}" y2="{}" stroke="#ba2121"></line></svg>',
        width,
        height,
        width,
        height,
        title,
        width - 2,
        height - 2,
        filled,
        height - 2,
        color,
        warn_x,
        warn_x,
        height,
        limit_x,
        limit_x,
        height,
    )


def human_age(delta: timedelta | None) -> str:
    """An age in the largest units that read at a glance ("3 min", "2 h 5 min"); "—" if unknown."""
    if delta is None:
        return "—"
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"
