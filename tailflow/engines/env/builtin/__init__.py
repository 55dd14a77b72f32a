"""Environments that ship with tailflow: the calculator for the embedded arithmetic task, and a guessing game
(the shortest complete example of the interface)."""
