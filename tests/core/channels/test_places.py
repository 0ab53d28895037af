"""A shared place or contact as the line the thread keeps (core/channels/places.py)."""

from __future__ import annotations

import pytest

from core.channels.places import FIELD_LIMIT, contact_text, location_text


def test_a_venue_is_its_name_its_address_and_its_coordinates_to_four_decimals() -> None:
    assert (
        location_text(40.41548, -3.70742, "Plaza Mayor", "Madrid")
        == "[location: Plaza Mayor, Madrid · 40.4155, -3.7074]"
    )
    assert location_text(40.41548, -3.70742, "Plaza Mayor") == "[location: Plaza Mayor · 40.4155, -3.7074]"
    assert location_text(40.41548, -3.70742, None, "Madrid") == "[location: Madrid · 40.4155, -3.7074]"
    assert location_text(40.41548, -3.70742) == "[location: 40.4155, -3.7074]"


def test_coordinates_come_as_numbers_or_as_twilio_s_strings() -> None:
    assert location_text("52.303897857666016", "4.750025749206543") == "[location: 52.3039, 4.7500]"
    assert location_text(-90, 180) == "[location: -90.0000, 180.0000]"
    # A tiny negative rounds to zero, written without its sign.
    assert location_text(-0.00001, -0.00004) == "[location: 0.0000, 0.0000]"


@pytest.mark.parametrize(
    ("latitude", "longitude"),
    [
        (None, 2.1),
        (41.3, None),
        ("x", "2.1"),
        (float("nan"), 2.1),
        (float("inf"), 2.1),
        (90.5, 2.1),
        (41.3, -180.1),
        (True, 2.1),
        (10**400, 2.1),  # a JSON integer past a float's range
    ],
)
def test_coordinates_that_are_no_place_are_left_out(latitude: object, longitude: object) -> None:
    assert location_text(latitude, longitude) is None
    assert location_text(latitude, longitude, "Casa de Ana") == "[location: Casa de Ana]"


def test_a_name_is_one_line_without_control_characters_and_at_most_its_limit() -> None:
    assert (
        location_text(1, 2, "  Bar\n\tPepe\x00 ", "Calle\u2028Mayor 1")
        == "[location: Bar Pepe, Calle Mayor 1 · 1.0000, 2.0000]"
    )
    long_name = "Ñ" * (FIELD_LIMIT + 50)
    said = location_text(1, 2, long_name)
    assert said == "[location: " + "Ñ" * (FIELD_LIMIT - 1) + "… · 1.0000, 2.0000]"
    assert location_text(1, 2, " \n ", 7) == "[location: 1.0000, 2.0000]"


def test_a_contact_is_its_name_and_never_its_number() -> None:
    assert contact_text("Ana", "López") == "[contact: Ana López]"
    assert contact_text("Wundzen 💎") == "[contact: Wundzen 💎]"
    assert contact_text(None, None) == "[contact]"
    assert contact_text(" ", 5) == "[contact]"
