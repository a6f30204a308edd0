"""runtime.mountinfo.unescape: mountinfo's octal escapes, wherever they stand in the field."""
from __future__ import annotations

import pytest

from runtime.mountinfo import unescape


@pytest.mark.parametrize("field,path", [
    ("/plain", "/plain"),
    ("/a\\040b", "/a b"),
    ("/end\\040", "/end "),                      # an escape that ends the field
    ("/t\\011n\\012b\\134", "/t\tn\nb\\"),
    ("/short\\04", "/short\\04"),                # not three digits: kept as it is
    ("/caf\\303\\251", "/café"),                 # escaped bytes of a UTF-8 name
    ("/ü\\040x", "/ü x"),
])
def test_unescape(field, path):
    assert unescape(field) == path
