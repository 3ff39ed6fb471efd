"""Robust location and spread of measured series (planner/calibrate/robust.py) against hand
arithmetic: the median absolute deviation, Iglewicz & Hoaglin's (1993) modified z-score
M = 0.6745 (x - median) / MAD with |M| > 3.5 an outlier, the standard error of the median
(sqrt(pi/2) sigma / sqrt(n) for normal noise) and the geometric mean."""

import math

import pytest

from planner.calibrate.robust import MAD_TO_SIGMA, OUTLIER_Z, geometric_mean, mad, median_standard_error, modified_z


def test_constants_are_iglewicz_and_hoaglins():
    """0.6745: the 0.75 quantile of the standard normal; 3.5 the recommended cut."""
    assert MAD_TO_SIGMA == 0.6745
    assert OUTLIER_Z == 3.5


def test_mad_is_the_median_of_the_absolute_deviations():
    """[1, 2, 3, 4, 100]: median 3, deviations [2, 1, 0, 1, 97], their median 1; the outlier does
    not move it."""
    assert mad([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0
    # even count: median 2.5, deviations [1.5, 0.5, 0.5, 1.5], median 1.0
    assert mad([1.0, 2.0, 3.0, 4.0]) == 1.0
    assert mad([5.0, 5.0, 5.0]) == 0.0


def test_modified_z_flags_the_outlier_and_keeps_the_rest():
    """Against median 3 and MAD 1: 100 gives 0.6745 x 97 = 65.4 (an outlier), 4 gives 0.6745
    (not one); 8 gives 0.6745 x 5 = 3.37, just inside the 3.5 cut."""
    assert modified_z(100.0, 3.0, 1.0) == pytest.approx(65.4265)
    assert modified_z(4.0, 3.0, 1.0) == pytest.approx(0.6745)
    assert modified_z(8.0, 3.0, 1.0) == pytest.approx(3.3725)
    assert abs(modified_z(8.0, 3.0, 1.0)) < OUTLIER_Z < abs(modified_z(9.0, 3.0, 1.0))   # 4.047
    assert modified_z(-2.0, 3.0, 1.0) == pytest.approx(-3.3725)
    # no spread: no score (nothing to compare against)
    assert modified_z(10.0, 3.0, 0.0) == 0.0


def test_median_standard_error_relative_to_the_median():
    """[9, 10, 11]: median 10, MAD 1, sigma = 1 / 0.6745 = 1.4826; sqrt(pi/2) = 1.2533;
    1.2533 x 1.4826 / sqrt(3) / 10 = 0.10728."""
    assert median_standard_error([9.0, 10.0, 11.0]) == pytest.approx(0.10728, rel=1e-4)
    assert median_standard_error([9.0, 10.0, 11.0]) == pytest.approx(
        math.sqrt(math.pi / 2) * (1 / 0.6745) / math.sqrt(3) / 10)
    # four samples 1, 2, 3, 4: median 2.5, MAD 1.0 -> 1.2533 x 1.4826 / 2 / 2.5 = 0.37163
    assert median_standard_error([1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.37163, rel=1e-4)
    # one sample has no spread to measure; a zero median has no relative error
    assert median_standard_error([7.0]) == 0.0
    assert median_standard_error([-1.0, 0.0, 1.0]) == 0.0


def test_geometric_mean():
    """(1 x 100)^(1/2) = 10; (2 x 8)^(1/2) = 4; (1 x 2 x 4)^(1/3) = 2; one value is itself."""
    assert geometric_mean([1.0, 100.0]) == pytest.approx(10.0)
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([1.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([3.0]) == pytest.approx(3.0)
