#!/bin/sh
echo "remote_coverage_tools stand-in: 'bazel coverage' is not supported in this offline Bazel 4.2.3 setup" >&2
exit 1
