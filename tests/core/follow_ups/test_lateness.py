"""A follow-up said late says when it was due (core/follow_ups/lateness.py): past five minutes, in
the person's language and on their clock; a clock the test sets, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core.follow_ups.lateness import LATE_AFTER, said_late
from core.phrases.catalogue import Catalogue

MADRID = ZoneInfo("Europe/Madrid")
# 09:00 in Madrid on Thursday 3 December 2026.
DUE = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
CATALOGUE = Catalogue()


@pytest.mark.parametrize(
    ("after", "said"),
    [
        # The job runs every minute and tries a failure again after 1 and 2 minutes: on time.
        (timedelta(seconds=50), "Call the dentist."),
        (LATE_AFTER, "Call the dentist."),
        (LATE_AFTER + timedelta(seconds=1), "Call the dentist.\n\n(due at 09:00, sent late)"),
        (timedelta(hours=14, minutes=59), "Call the dentist.\n\n(due at 09:00, sent late)"),
        # Midnight in Madrid has passed (it is 00:00 on Friday there): yesterday's.
        (timedelta(hours=15), "Call the dentist.\n\n(due yesterday at 09:00, sent late)"),
        (timedelta(days=2), "Call the dentist.\n\n(due on Thu 3 Dec at 09:00, sent late)"),
    ],
)
def test_a_follow_up_says_when_it_was_due_only_past_five_minutes(after: timedelta, said: str) -> None:
    assert said_late("Call the dentist.", DUE, DUE + after, MADRID, CATALOGUE.phrases("en")) == said


@pytest.mark.parametrize(
    ("due", "after", "said"),
    [
        (DUE, timedelta(hours=1), "Llama al dentista.\n\n(programado para las 09:00, enviado con retraso)"),
        (
            DUE,
            timedelta(days=1),
            "Llama al dentista.\n\n(programado para ayer a las 09:00, enviado con retraso)",
        ),
        (
            DUE,
            timedelta(days=3),
            "Llama al dentista.\n\n(programado para el jueves 3 de diciembre a las 09:00, enviado con retraso)",
        ),
        # One o'clock is "la una": "a la 01:30", not "a las".
        (
            datetime(2026, 12, 3, 0, 30, tzinfo=UTC),
            timedelta(hours=2),
            "Llama al dentista.\n\n(programado para la 01:30, enviado con retraso)",
        ),
    ],
)
def test_in_spanish(due: datetime, after: timedelta, said: str) -> None:
    assert said_late("Llama al dentista.", due, due + after, MADRID, CATALOGUE.phrases("es")) == said


def test_the_hour_is_the_persons_own() -> None:
    """09:00 in Madrid is 03:00 in New York, and 08:00 in UTC."""
    late = DUE + timedelta(minutes=30)
    phrases = CATALOGUE.phrases("en")
    assert said_late("Up.", DUE, late, ZoneInfo("America/New_York"), phrases) == "Up.\n\n(due at 03:00, sent late)"
    assert said_late("Up.", DUE, late, ZoneInfo("UTC"), phrases) == "Up.\n\n(due at 08:00, sent late)"


def test_a_date_of_another_year_says_its_year() -> None:
    """A WhatsApp reminder held over the new year, for the person's next message."""
    due, now = datetime(2025, 12, 30, 8, 0, tzinfo=UTC), datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    assert (
        said_late("Up.", due, now, MADRID, CATALOGUE.phrases("en"))
        == "Up.\n\n(due on Tue 30 Dec 2025 at 09:00, sent late)"
    )
    assert (
        said_late("Arriba.", due, now, MADRID, CATALOGUE.phrases("es"))
        == "Arriba.\n\n(programado para el martes 30 de diciembre de 2025 a las 09:00, enviado con retraso)"
    )


@pytest.mark.parametrize(
    ("due", "now", "said"),
    [
        # Madrid's clocks go from 02:00 to 03:00 on 29 March 2026: 01:59 was due, it is 03:10.
        (
            datetime(2026, 3, 29, 0, 59, tzinfo=UTC),
            datetime(2026, 3, 29, 1, 10, tzinfo=UTC),
            "(due at 01:59, sent late)",
        ),
        # And back from 03:00 to 02:00 on 25 October: 02:30 summer time, said at 02:30 winter time.
        (
            datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
            datetime(2026, 10, 25, 1, 30, tzinfo=UTC),
            "(due at 02:30, sent late)",
        ),
        # A day of 23 hours: 09:00 on Saturday 28 March is yesterday at 09:00 on Sunday.
        (
            datetime(2026, 3, 28, 8, 0, tzinfo=UTC),
            datetime(2026, 3, 29, 7, 0, tzinfo=UTC),
            "(due yesterday at 09:00, sent late)",
        ),
    ],
)
def test_across_the_changes_of_summer_time(due: datetime, now: datetime, said: str) -> None:
    assert said_late("Up.", due, now, MADRID, CATALOGUE.phrases("en")) == f"Up.\n\n{said}"
