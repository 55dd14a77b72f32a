"""Environments that ship with tailflow: the calculator for the embedded arithmetic task, a guessing game (the
shortest complete example of the interface), and a code interpreter (Python tool calls in the reward's sandbox,
then an integer answer)."""
