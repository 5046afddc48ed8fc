"""A dead pipeline (the process owning the chDB store) is named as such, in words, with what to do:
it used to read "the store owner at http://... did not answer: <urlopen error [Errno 111] ...>"."""

import socket

import pytest

from consumers.evidence.endpoint import RemoteStore
from consumers.evidence.exceptions import StoreUnavailable


def test_a_pipeline_that_is_not_running_is_named_in_one_line():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RemoteStore(f"http://127.0.0.1:{port}", "sepa", timeout=5)
    with pytest.raises(StoreUnavailable) as caught:
        store.query("SELECT 1")
    said = str(caught.value)
    assert said == (f"the pipeline process that owns the evidence store (http://127.0.0.1:{port}) is not running "
                    "(nothing listens there); `sepa-eval up` restarts it")
    assert "urlopen" not in said and "Errno" not in said
