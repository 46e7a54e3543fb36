"""The closed-choice questions the whole-option tests ask (``test_choice``, and the vLLM
parity tests): options sharing first tokens (one a prefix of another), as GISTBench's 325
categories do, and interests to place among them."""

OPTIONS = [
    "Comedy",
    "Comedy Challenges",
    "Diving",
    "Drama",
    "Disability",
    "Sci-Tech News",
    "Movies & TV Reviews or Commentary",
    "Scripted Dramatic Content",
    "Humorous Moments",
    "Fantasy & Mythology",
]
FILLS = ["Drama and Romance", "Comedy and Adventure", "Sci-Fi films", "scuba diving trips"]
