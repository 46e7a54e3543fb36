"""The title screen that keeps free-text answers naming a dataset title out of checkpoints."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjudge.data import TitleScreen

TITLES = [
    "Godfather, The (1972)",
    "Star Wars: Episode IV - A New Hope (1977)",
    "City of Lost Children, The (Cité des enfants perdus, La) (1995)",
    "Heat (1995)",
    "Seven (Se7en) (1995)",
    "Harry Potter and the Sorcerer's Stone (Book 1)",
]


@pytest.mark.parametrize(
    "text",
    [
        "The Godfather saga",  # article moved back to the front
        "Godfather style films",  # and dropped
        "Star Wars space opera",  # the part before the subtitle
        "A New Hope",  # the part after it
        "heat-seeking thrillers",  # punctuation splits words
        "Se7en style noir",  # a parenthesised alternative title
        "Cite des enfants perdus",  # accents folded: answers may be ASCII-only
        "HARRY POTTER AND THE SORCERER'S STONE",
        "Harry Potter and the Sorcerer's Stone fans",  # "(Book 1)" does not hide it
    ],
)
def test_common_spellings_of_a_title_are_caught(text):
    assert TitleScreen(TITLES).names_title(text)


@pytest.mark.parametrize(
    "text",
    ["fatherhood dramas", "heated romance", "lost children", "space opera", "seventies films"],
)
def test_words_inside_other_words_or_partial_titles_are_not_titles(text):
    assert not TitleScreen(TITLES).names_title(text)


def test_an_empty_screen_names_nothing():
    assert len(TitleScreen([])) == 0
    assert not TitleScreen([]).names_title("Heat (1995)")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet="abcdefgh ", min_size=1, max_size=12), min_size=1, max_size=5),
    st.text(alphabet="abcdefgh ,.:-", max_size=12),
    st.text(alphabet="abcdefgh ,.:-", max_size=12),
)
def test_a_title_inside_any_text_is_caught(titles, before, after):
    screen = TitleScreen(titles)
    for t in titles:
        if t.split():  # a title with words
            assert screen.names_title(f"{before} {t} {after}")
