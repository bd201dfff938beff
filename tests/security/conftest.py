"""The attack battery (issue 62): each module tries one class of published attack on model
servers against a real ``gelu-serve serve`` (``tests.servers``); each case's docstring names
the CVE or advisory it comes from."""
