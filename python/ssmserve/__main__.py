"""`python -m ssmserve ...`: the `ssmserve` command (serve / generate / bench)."""
from ._cli import main

main()
