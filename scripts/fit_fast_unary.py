#!/usr/bin/env python3
"""Fits the polynomial coefficients of burn-mlx's CPU `exp`, `tanh` and `erf` kernels
(mlx-sys/fast_unary.cpp) and checks the kernels' float32 arithmetic against Python's
double-precision `math` functions.

    python3 -m venv /tmp/fit && /tmp/fit/bin/pip install numpy
    /tmp/fit/bin/python scripts/fit_fast_unary.py

Each fit is a least-squares fit of relative error on Chebyshev nodes (numpy.polyfit), then
the whole kernel is replayed in float32 (numpy float32 arithmetic, one rounding per operation,
as the C++ does without FMA) over a dense grid, and the largest error is printed in ulps of the
exact result. The printed coefficients are the ones in fast_unary.cpp.
"""
import math

import numpy as np

F = np.float32


def cheb(a, b, n=4000):
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def fit(x, y, deg, w):
    """Coefficients, highest power first, of the polynomial fit to y(x) with weights w."""
    return np.polyfit(x, y, deg, w=w)


def horner32(c, x):
    p = np.full_like(x, F(c[0]))
    for ci in c[1:]:
        p = p * x + F(ci)
    return p


def ulps(approx, exact):
    exact32 = exact.astype(np.float32)
    spacing = np.abs(np.spacing(exact32)).astype(np.float64)
    spacing[spacing == 0] = np.finfo(np.float32).smallest_subnormal
    return np.max(np.abs(approx.astype(np.float64) - exact) / spacing)


LN2_HI = F(0.693145751953125)  # 8 significant bits: k * LN2_HI is exact for |k| <= 2^15
LN2_LO = F(math.log(2) - 0.693145751953125)


def exp32(x, c):
    x = x.astype(np.float32)
    xc = np.clip(x, F(-104.0), F(88.8))
    k = np.rint(xc * F(1.0 / math.log(2))).astype(np.float32)
    r = (xc - k * LN2_HI) - k * LN2_LO
    p = horner32(c, r)
    ki = k.astype(np.int32)
    k1 = ki >> 1
    k2 = ki - k1
    s1 = ((k1 + 127) << 23).astype(np.int32).view(np.float32)
    s2 = ((k2 + 127) << 23).astype(np.int32).view(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        return (p * s1) * s2


def tanh32(x, small, c_exp):
    x = x.astype(np.float32)
    t = np.abs(x)
    s = t * t
    poly = t + t * s * horner32(small, s)
    with np.errstate(over="ignore"):
        e = exp32(t + t, c_exp)
        big = F(1) - F(2) / (e + F(1))
    y = np.where(t < F(0.625), poly, big)
    return np.copysign(y, x)


def erf32(x, small, large, c_exp):
    x = x.astype(np.float32)
    t = np.abs(x)
    s = t * t
    lo = t * horner32(small, s)
    tt = np.minimum(t, F(4.0))
    hi = F(1) - exp32(horner32(large, tt), c_exp)
    y = np.where(t < F(1.0), lo, hi)
    return np.copysign(y, x)


def main():
    half = math.log(2) / 2
    r = cheb(-half, half)
    c_exp = fit(r, np.exp(r), 6, 1 / np.exp(r))
    print("exp, degree 6 on [-ln2/2, ln2/2]:", ", ".join(f"{v:.9e}" for v in c_exp))

    x = cheb(1e-4, 0.625)
    small_t = fit(x * x, (np.tanh(x) - x) / x**3, 4, x**3 / np.tanh(x))
    print("tanh, x + x^3 P(x^2), degree 4:", ", ".join(f"{v:.9e}" for v in small_t))

    x = cheb(1e-4, 1.0)
    erf_x = np.array([math.erf(v) for v in x])
    small_e = fit(x * x, erf_x / x, 6, x / erf_x)
    print("erf, x P(x^2) on [0, 1), degree 6:", ", ".join(f"{v:.9e}" for v in small_e))

    t = cheb(1.0, 4.0)
    log_erfc = np.array([math.log(math.erfc(v)) for v in t])
    large_e = fit(t, log_erfc, 10, np.array([math.erfc(v) for v in t]) * 1e3)
    print("erf, 1 - exp(Q(x)) on [1, 4], degree 10:", ", ".join(f"{v:.9e}" for v in large_e))

    # Exact values are of the float32 inputs the kernels see.
    grid = np.linspace(-90.0, 89.0, 2_000_001).astype(np.float32).astype(np.float64)
    exact = np.exp(grid)
    ok = exact < 3.4e38
    print("exp max error (ulp):", ulps(exp32(grid, c_exp)[ok], exact[ok]))
    grid = np.concatenate([np.linspace(-10, 10, 2_000_001), np.geomspace(1e-30, 1, 200_001)])
    grid = grid.astype(np.float32).astype(np.float64)
    print("tanh max error (ulp):", ulps(tanh32(grid, small_t, c_exp), np.tanh(grid)))
    exact = np.array([math.erf(v) for v in grid])
    print("erf max error (ulp):", ulps(erf32(grid, small_e, large_e, c_exp), exact))


if __name__ == "__main__":
    main()
