"""FastPP inside SGLang 0.5.23: a plugin applying our policies to SGLang's PP loop, and its launcher."""
