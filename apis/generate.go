//go:build generate

// Generation of deepcopy functions, CRDs and Crossplane method sets (by
// hack/methodsets, since angryjet cannot read crossplane-runtime v2.4.0's
// types; see there). Run
// `make generate`; never edit zz_generated.* or package/crds by hand.

//go:generate rm -rf ../package/crds
//go:generate go tool -modfile=../hack/tools/go.mod controller-gen object:headerFile=../hack/boilerplate.go.txt paths=./... crd:crdVersions=v1 output:artifacts:config=../package/crds
//go:generate go run ../hack/methodsets ../hack/boilerplate.go.txt ./namespaced/proxy/v1alpha1 ./cluster/proxy/v1alpha1 ./namespaced/v1alpha1 ./cluster/v1alpha1

package apis
