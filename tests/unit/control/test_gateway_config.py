"""The gateway's settings: CORRAL_HTTP_MAX_BODY_BYTES and CORRAL_GATEWAY_MODE, read and checked."""

import pytest

from control.config import ConfigError, ControlConfig


def test_defaults_and_environment() -> None:
    default = ControlConfig.from_env({})
    assert default.http_max_body_bytes == 64 << 20 and default.gateway_mode == "inprocess"
    config = ControlConfig.from_env({"CORRAL_HTTP_MAX_BODY_BYTES": "4096", "CORRAL_GATEWAY_MODE": " Loopback "})
    assert config.http_max_body_bytes == 4096 and config.gateway_mode == "loopback"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CORRAL_HTTP_MAX_BODY_BYTES": "0"}, "CORRAL_HTTP_MAX_BODY_BYTES must be 1..67108864, got 0"),
        ({"CORRAL_HTTP_MAX_BODY_BYTES": "big"}, "CORRAL_HTTP_MAX_BODY_BYTES must be an integer, got 'big'"),
        ({"CORRAL_GATEWAY_MODE": "grpc"}, "CORRAL_GATEWAY_MODE must be inprocess or loopback, got 'grpc'"),
    ],
)
def test_bad_values_name_the_variable_and_the_rule(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ControlConfig.from_env(env)
