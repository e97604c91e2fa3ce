# The two commands of a fresh machine: `make demo` and `make test`.
.PHONY: setup demo test

setup:
	bash scripts/setup.sh

demo: setup
	python -m eval recipe=humaneval_smollm2

test: setup
	bash scripts/test.sh
