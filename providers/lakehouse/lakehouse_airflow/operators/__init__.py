"""Operators: each does one action on one pipeline and says what it pushes to XCom."""
