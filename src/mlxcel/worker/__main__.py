"""`python -m mlxcel.worker FD`: a model's worker process, on the socket the HTTP process passed."""

import sys

from mlxcel.worker.main import main

main(sys.argv)
