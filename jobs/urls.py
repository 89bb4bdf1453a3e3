"""The URLs the nightly takes: webhooks (``--notify``, a secret) and where
its site is served (``--site-url``, public), each checked whole before Ray
starts, and a webhook shown only redacted.

A webhook's path and query are its secret (whoever has them can post to
the channel), so :func:`redact` keeps the scheme and the host (with its
port) and nothing else: ``https://hooks.example.com/…redacted``. Every
line the jobs print and every field they store shows a webhook that way;
an error message from a delivery goes through :func:`scrub` first.

A webhook is refused (:func:`check_webhook`, ValueError naming it
redacted) unless it is an ``http://`` or ``https://`` URL with a host, of
printable ASCII without spaces (a space, CR/LF, a tab or any other control
character would break the request line: ``http.client.InvalidURL``), with
no credentials (``user:pass@``: they would be printed with the host), a
port in 1..65535 when it names one, and at most :data:`MAX_LENGTH`
characters. A site URL (:func:`check_site_url`) is ``http(s)://host...``
or a relative path, with no whitespace, control character or one of
``<>"`\\`` (it is written into Markdown links); ``javascript:`` and other
schemes are refused.
"""

from __future__ import annotations

import re
import urllib.parse

MAX_LENGTH = 2048
"""Longest webhook URL taken (chat webhooks are under 200 characters)."""
REDACTED = "…redacted"
MIN_PIECE = 4
"""Path segments and query values this long or longer are scrubbed on their own."""
WEBHOOK_SCHEMES = ("http", "https")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_SITE_FORBIDDEN = set('<>"`\\')


def _bad_char(text: str) -> str | None:
    """The first character of ``text`` a URL may not hold literally (a
    space or other whitespace, a control character, anything non-ASCII or
    not printable), described with its position; None when there is none."""
    for i, ch in enumerate(text):
        if ch.isspace() or not ch.isprintable() or not ch.isascii():
            return f"a {'space' if ch == ' ' else 'control or non-ASCII character'} " \
                   f"({ascii(ch)}) at position {i}"
    return None


def redact(url: str) -> str:
    """``scheme://host[:port]/…redacted``: what may be shown of a webhook.
    Total: any text gives an answer that holds no path, query, fragment or
    credentials of it (a text with no recognisable host gives
    ``<redacted URL>``)."""
    text = str(url)
    scheme = _SCHEME.match(text)
    rest = text[scheme.end():] if scheme else text
    if not rest.startswith("//"):
        return "<redacted URL>"
    netloc = re.split(r"[/?#]", rest[2:], maxsplit=1)[0]
    host = netloc.rpartition("@")[2]  # credentials, if any, are left out
    if not host or _bad_char(host):
        host = "<host>" if host else ""
    if not host:
        return "<redacted URL>"
    name = scheme.group(1).lower() if scheme else ""
    return f"{name}://{host}/{REDACTED}" if name else f"//{host}/{REDACTED}"


def check_webhook(url: str) -> str:
    """``url`` if it is a webhook the nightly may post to, else ValueError
    saying why, the URL shown redacted (module docstring)."""
    shown = redact(url)
    if not isinstance(url, str) or not url:
        raise ValueError("an empty URL; expected http:// or https:// and a host")
    if len(url) > MAX_LENGTH:
        raise ValueError(f"{shown}: {len(url)} characters, more than {MAX_LENGTH}")
    bad = _bad_char(url)
    if bad:
        raise ValueError(f"{shown}: the URL holds {bad}; percent-encode it or remove it")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ValueError(f"{shown}: not a URL ({scrub(str(err), url)})") from None
    if parts.scheme not in WEBHOOK_SCHEMES or not parts.hostname:
        raise ValueError(f"{shown} is not an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        raise ValueError(f"{shown}: the URL holds credentials (user:password@host); put the "
                         f"secret in the path or query the service gave, not in the host part")
    if port == 0:
        raise ValueError(f"{shown}: port 0; expected a port in 1..65535")
    return url


def check_site_url(url: str) -> str:
    """``url`` if it may be the base of the message's page links (module
    docstring), else ValueError naming it."""
    if not isinstance(url, str) or not url:
        raise ValueError("an empty URL; expected http(s)://host/... or a relative path")
    bad = _bad_char(url)
    if bad:
        raise ValueError(f"{url!r} holds {bad}; percent-encode it")
    odd = sorted({ch for ch in url if ch in _SITE_FORBIDDEN})
    if odd:
        raise ValueError(f"{url!r} holds {''.join(odd)!r}, which a URL may not hold literally")
    if len(url) > MAX_LENGTH:
        raise ValueError(f"{url[:40]!r}...: {len(url)} characters, more than {MAX_LENGTH}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port
    except ValueError as err:
        raise ValueError(f"{url!r}: not a URL ({err})") from None
    if parts.scheme or parts.netloc or _SCHEME.match(url):
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is neither an http:// or https:// URL with a host nor a "
                             f"relative path")
    return url


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with every piece of ``url`` that is
    secret (the whole, the path, query and fragment, each path segment and
    query value of :data:`MIN_PIECE` characters or more, the credentials)
    replaced by :data:`REDACTED`, also as ``repr`` would quote them."""
    text = str(text)
    pieces = {url}
    try:
        p = urllib.parse.urlsplit(url)
        pieces |= {p.path + ("?" + p.query if p.query else ""), p.path, p.query, p.fragment,
                   p.netloc.rpartition("@")[0], url.split("#")[0]}
    except ValueError:
        pass
    scheme = _SCHEME.match(url)
    rest = url[scheme.end():] if scheme else url
    if rest.startswith("//"):  # what follows the host, even where urlsplit gives up
        cut = re.search(r"[/?#]", rest[2:])
        if cut:
            tail = rest[2 + cut.start():]
            # and each piece of it long enough to be a token (a message may quote one)
            pieces |= {tail, tail[1:], *(w for w in re.split(r"[/?#&=;]", tail)
                                         if len(w) >= MIN_PIECE)}
    for piece in sorted((q for q in pieces if q and q != "/" and len(q) > 1), key=len,
                        reverse=True):
        for form in (piece, repr(piece)[1:-1], ascii(piece)[1:-1]):
            text = text.replace(form, REDACTED)
    return text
