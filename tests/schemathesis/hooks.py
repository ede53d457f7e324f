"""Hooks for the schemathesis run: how to make an `endpoint-url`.

The API accepts what the WHATWG URL parser accepts (http or https, a host, no fragment),
which no regular expression describes exactly. So the document names the format, and valid
examples come from here; an invalid one is any non-string or a string over 2048 characters.
"""

import schemathesis
from hypothesis import strategies as st

LABEL = r"[a-z][a-z0-9-]{0,15}"
ENDPOINT_URL = (
    rf"\Ahttps?://{LABEL}(\.{LABEL}){{0,3}}"  # a host name (no IP literal: nothing to reach)
    r"(:[1-9][0-9]{0,3})?"  # an optional port
    r"(/[A-Za-z0-9._~-]{0,12}){0,3}"  # an optional path
    r"(\?[a-z]{1,8}=[A-Za-z0-9]{0,8})?\Z"  # an optional query
)

schemathesis.openapi.format("endpoint-url", st.from_regex(ENDPOINT_URL))
