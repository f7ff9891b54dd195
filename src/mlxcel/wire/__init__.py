"""What both sides of a model's process boundary share: the messages on the socket
(messages.py) and the plain facts and items a worker sends back (facts.py)."""
