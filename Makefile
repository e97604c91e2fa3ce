# The two commands of a fresh machine: `make demo` and `make test`.
.PHONY: setup demo test

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

test: setup
	bash scripts/test.sh
