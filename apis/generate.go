//go:build generate

// Generation of the kinds of both scopes from one table (by hack/genkinds),
// then of deepcopy functions, CRDs and Crossplane method sets (by
// hack/methodsets, since angryjet cannot read crossplane-runtime v2.4.0's
// types; see there). Run
// `make generate`; never edit zz_generated.* or package/crds by hand.

//go:generate go run ../hack/genkinds ../hack/boilerplate.go.txt
//go:generate rm -rf ../package/crds
//go:generate go tool -modfile=../hack/tools/go.mod controller-gen object:headerFile=../hack/boilerplate.go.txt paths=./... crd:crdVersions=v1 output:artifacts:config=../package/crds
//go:generate go run ../hack/methodsets ../hack/boilerplate.go.txt ./namespaced/proxy/v1alpha1 ./cluster/proxy/v1alpha1 ./namespaced/v1alpha1 ./cluster/v1alpha1

package apis
