"""``fastpp goodput --attainment`` outside (0, 1] is refused by name (issue 27: ``--attainment 0``
silently ran at 90%)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5", "nan", "inf"])
def test_an_attainment_outside_zero_to_one_is_refused(value):
    res = CliRunner().invoke(
        app, ["goodput", "--attainment", value, "-n", "20", "--seeds", "1"], catch_exceptions=False
    )
    assert res.exit_code != 0
    assert "--attainment must be in (0, 1]" in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output
