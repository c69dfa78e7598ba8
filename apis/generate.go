//go:build generate

// Generation of the kinds of both scopes from one table (by hack/genkinds),
// then of deepcopy functions, CRDs and the method sets crossplane-runtime's
// interfaces need (by crossplane-tools' angryjet, hack/angryjet-bins.sh).
// Run `make generate`; never edit zz_generated.* or package/crds by hand.
//
// angryjet runs on the kinds' packages only: it loads what it is given,
// and this package's compile-time interface checks fail until it has run.
// Its earlier output goes first, so that a kind's removal leaves no methods
// behind on a type that is gone.

//go:generate go run ../hack/genkinds ../hack/boilerplate.go.txt
//go:generate rm -rf ../package/crds
//go:generate go tool -modfile=../hack/tools/go.mod controller-gen object:headerFile=../hack/boilerplate.go.txt paths=./... crd:crdVersions=v1 output:artifacts:config=../package/crds
//go:generate find ./namespaced ./cluster ( -name zz_generated.managed.go -o -name zz_generated.managedlist.go -o -name zz_generated.pc.go -o -name zz_generated.pcu.go -o -name zz_generated.pculist.go ) -delete
//go:generate bash ../hack/angryjet-bins.sh generate-methodsets --header-file=../hack/boilerplate.go.txt ./namespaced/...
//go:generate bash ../hack/angryjet-bins.sh generate-methodsets --header-file=../hack/boilerplate.go.txt ./cluster/...

package apis
