"""Lesson 09h: a tensor through torch's float8 dtypes. The tensorwise scale puts the tensor's amax
on the format's max; with it a tensor spanning many powers of two comes back far closer than cast
as it is; the formats' table is torch.finfo's, and its smallest values are what torch stores."""

import pytest
import torch

from lessons.bylesson import float8

pytestmark = pytest.mark.fast

FP8 = (float8.E4M3, float8.E5M2)


def wide(seed=0, n=4096):
    """Values whose magnitudes spread over 10^-8 to 1, both signs: a gradient's kind of range."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).sign() * 10 ** (-8 * torch.rand(n, generator=g))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_the_scale_puts_amax_on_the_formats_max(dtype):
    x = wide() * 3e-4
    scale = float8.dynamic_scale(x, dtype)
    top = torch.finfo(dtype).max
    assert abs(float8.amax(x) * scale / top - 1) < 1e-6
    assert float8.to_float8(x, dtype, scale).float().abs().max().item() == top
    assert float8.cast(x, dtype, scale)["saturated_pct"] == 0


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_scaling_loses_less_of_a_wide_tensor_than_casting_it_as_it_is(dtype):
    x = wide() * 1e-5  # amax near 1e-5: below both formats' smallest normal
    plain = float8.cast(x, dtype)
    scaled = float8.cast(x, dtype, float8.dynamic_scale(x, dtype))
    assert scaled["error"] < plain["error"] / 2, (plain, scaled)
    assert scaled["flushed_pct"] < plain["flushed_pct"]


def test_a_scale_too_large_saturates_and_the_count_says_so():
    x = torch.tensor([1.0, 2.0, 4.0, 8.0])
    dtype = float8.E4M3
    out = float8.cast(x, dtype, scale=float8.dynamic_scale(x, dtype) * 4)  # 8 lands on 4 x max
    assert out["saturated_pct"] == 50  # 4 and 8 beyond the max, 1 and 2 within it
    assert float8.to_float8(x, dtype, 448 / 2).float().tolist() == [224, 448, 448, 448]
    # up to half E4M3's top step (32) above 448 a value rounds to 448 anyway: nothing is lost there
    assert float8.cast(torch.tensor([460.0, 470.0]), dtype)["saturated_pct"] == 50
    # clamped first: E5M2's cast alone gives inf beyond 61440
    assert float8.to_float8(torch.tensor([1e5]), float8.E5M2).float().item() == 57344


def test_delayed_scaling_uses_the_steps_before_and_saturates_when_amax_grows():
    xs = [torch.full((4,), v) for v in (1.0, 1.0, 4.0)]
    rows = float8.scales(xs, float8.E4M3, history=2).set_index("step")
    assert rows.loc[2, "delayed_over_dynamic"] == 4  # scale 448 (steps 0, 1's amax 1) over 112
    assert rows.loc[2, "delayed_saturated_pct"] == 100
    assert rows.loc[2, "dynamic_saturated_pct"] == 0
    assert rows.loc[1, "delayed_saturated_pct"] == 0


def test_the_formats_are_torchs_and_their_extremes_are_what_torch_stores():
    table = float8.formats().set_index("format")
    assert table.loc["float8_e4m3fn", ["exponent", "mantissa", "max"]].tolist() == [4, 3, 448]
    assert table.loc["float8_e5m2", ["exponent", "mantissa", "max"]].tolist() == [5, 2, 57344]
    for dtype in FP8 + (torch.bfloat16, torch.float16):
        tiny = float8.smallest_subnormal(dtype)
        assert torch.tensor([tiny]).to(dtype).float().item() == tiny
        assert torch.tensor([tiny * 0.49]).to(dtype).float().item() == 0
    assert float8.bits(float8.E4M3) == "0 1111 110"  # 1.75 x 2^8: all ones is E4M3's NaN
    assert float8.bits(float8.E5M2) == "0 11110 11"  # exponent all ones: inf and NaN


def test_scaled_mm_on_this_cpu_is_the_float32_product_of_the_upcast_values():
    largest, _ = float8.scaled_mm_on_cpu()
    assert largest < 1e-4
