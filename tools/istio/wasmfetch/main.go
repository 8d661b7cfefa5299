// wasmfetch pulls a Wasm plugin image with Istio's own image fetcher
// (istio.io/istio/pkg/wasm, the code istio-agent runs for a WasmPlugin `url:
// oci://...`), and writes the module it extracts to a file.
//
//	wasmfetch <registry/repo:tag> <out.wasm>
//
// Prints `digest sha256:<hex>` (the manifest digest: what a WasmPlugin's
// `sha256` field is compared with) and `bytes <n>`. Exits 1 with the fetcher's
// error if Istio does not accept the image.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"istio.io/istio/pkg/wasm"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: wasmfetch <registry/repo:tag> <out.wasm>")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Insecure only skips TLS verification; a plain-HTTP registry on loopback is
	// reached through the fetcher's own http fallback.
	fetcher := wasm.NewImageFetcher(ctx, wasm.ImageFetcherOption{Insecure: true})
	binaryFetcher, digest, err := fetcher.PrepareFetch(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "prepare fetch:", err)
		os.Exit(1)
	}
	fmt.Printf("digest sha256:%s\n", digest)
	module, err := binaryFetcher()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fetch:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Args[2], module, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("bytes %d\n", len(module))
}
