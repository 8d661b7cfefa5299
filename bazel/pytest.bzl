"""sh_test wrappers that run the pytest files of tests/ against the Bazel-built .wasm."""

def envoy_pytest_suite(name, wasm, data, fast = [], classified = None, integration_tags = ["integration", "exclusive"]):
    """One sh_test per tests/test_*.py file, and a test_suite `name` of them all.

    Files not in `fast` start real Envoy and Fortio processes (their pytest
    markers say so): they get `integration_tags` ("integration" lets CI filter
    them out; "exclusive" keeps timing-sensitive runs from sharing the CPU with
    other tests) and size "medium" (timeout 300 s; each file takes well under a
    minute).

    Args:
      name: name of the test_suite.
      wasm: label of the .wasm under test (passed as THROTTLE_WASM).
      data: what the tests read: test helpers, harness, Envoy configs, pyproject.toml.
      fast: test files whose tests are all pure (from @test_tiers).
      classified: the files @test_tiers looked at; a file it has not seen yet is
        not fast (it is classified on the next `bazel sync --configure` or server start).
      integration_tags: tags of the other files' targets.
    """
    tests = []
    for src in native.glob(["test_*.py"]):
        test_name = src[:-len(".py")]
        is_fast = src in fast
        native.sh_test(
            name = test_name,
            srcs = ["//bazel:pytest_test.sh"],
            args = [
                "$(rootpath %s)" % wasm,
                "$(rootpath @host_test_tools//:host_tools.env)",
                "$(rootpath %s)" % src,
            ],
            data = [src, wasm, "@host_test_tools//:host_tools.env"] + data,
            size = "small" if is_fast else "medium",
            tags = [] if is_fast else integration_tags,
        )
        tests.append(":" + test_name)
    for src in fast:
        if src not in native.glob([src]):
            fail("envoy_pytest_suite: %s listed in fast but not found" % src)
    if classified != None:
        for src in native.glob(["test_*.py"]):
            if src not in classified:
                print("envoy_pytest_suite: %s is new to @test_tiers, treated as not fast until `bazel sync --configure`" % src)
    native.test_suite(name = name, tests = tests)
