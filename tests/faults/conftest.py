"""Fault tests reuse the Triton fixtures (tiny contract model) and skip without a tritonserver."""

from __future__ import annotations

import pytest

from tests.triton.conftest import rng, tiny  # noqa: F401 - fixtures


@pytest.fixture(scope="session")
def tritonserver_available() -> None:
    from wide_export.base.errors import WideError
    from wide_export.tritonserver.server import find_tritonserver

    try:
        find_tritonserver()
    except WideError as err:
        pytest.skip(f"no tritonserver: {err}")
