// Command workqueue-bench measures client-go's own work queue (workqueue.Typed) the way
// services/queue/benches/queue.rs measures Switchyard's queue core, for
// `bench queue.core_keys_client_go`: one goroutine adds n keys, then takes each (Get) and
// finishes it (Done), and the keys per second through add, get and done are printed.
//
// The keys are what kube-controller-manager's ReplicaSet controller queues: the string
// "namespace/name" (cache.MetaNamespaceKeyFunc), here "default/" and a 40-character name,
// the names the Rust benchmark uses. They are built before the clock starts, as an informer's
// event handler builds them before calling Add.
//
//	workqueue-bench <n>   prints `<keys per second>` on stdout
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"k8s.io/client-go/util/workqueue"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: workqueue-bench <keys>")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[1])
	if err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "workqueue-bench: keys must be a positive integer, got %q\n", os.Args[1])
		os.Exit(2)
	}

	keys := make([]string, n)
	for i := range keys {
		// 40 characters, like a generated Pod or ReplicaSet name (the Rust benchmark's name()).
		keys[i] = fmt.Sprintf("default/%040s", fmt.Sprintf("web-7d4b9c8f5d-%d", i))
	}
	// No metrics provider is set, so the queue runs no background goroutine.
	queue := workqueue.NewTyped[string]()
	defer queue.ShutDown()
	// The garbage left by building the keys is not the queue's.
	runtime.GC()

	start := time.Now()
	for _, key := range keys {
		queue.Add(key)
	}
	done := 0
	for queue.Len() > 0 {
		key, _ := queue.Get()
		queue.Done(key)
		done++
	}
	elapsed := time.Since(start)
	if done != n {
		fmt.Fprintf(os.Stderr, "workqueue-bench: %d keys done, %d added\n", done, n)
		os.Exit(1)
	}
	fmt.Printf("%.0f\n", float64(n)/elapsed.Seconds())
}
