package main

// The table the API packages are generated from. A new backend's kind is a
// row in proxies (and its parameters, <Name>Parameters, a type in
// apis/spec/v1alpha1); every other difference between the packages is a
// field of a row here or the scope's, in kinds.go.tmpl.

// proxies are the proxy managed resources, generated in both scopes' proxy
// packages with the parameters both share (apis/spec/v1alpha1's
// <Name>Parameters).
var proxies = []kind{
	{Name: "KVMProxy", Doc: "A KVMProxy is a Squid egress proxy running as a libvirt domain on a host reached over SSH."},
	{Name: "ProxmoxProxy", Doc: "A ProxmoxProxy is a Squid egress proxy running as a VM cloned from a template on Proxmox VE."},
	{Name: "GCPProxy", Doc: "A GCPProxy is a Squid egress proxy running as a Compute Engine instance."},
	{Name: "PodProxy", Doc: "A PodProxy is a Squid egress proxy running as a Deployment of Squid in a Kubernetes cluster."},
}

// packages are the generated API packages, by directory below apis/; each
// one's group and version are the +groupName and +versionName of its
// hand-written doc.go.
var packages = []apiPackage{
	{Dir: "namespaced/proxy/v1alpha1", Kinds: inScope(proxies, namespaced)},
	{Dir: "cluster/proxy/v1alpha1", Kinds: inScope(proxies, cluster)},
	{Dir: "namespaced/v1alpha1", Kinds: []kind{
		{Name: "ProviderConfig", Role: config, Scope: namespaced, Spec: "NamespacedProviderConfigSpec",
			Doc: "A ProviderConfig says where the proxies of its namespace run and with which\ncredentials (Secrets in the same namespace).",
			SpecDoc: "NamespacedProviderConfigSpec is a ProviderConfigSpec whose Secret refs\n" +
				"name Secrets in the config's own namespace, and which never uses the\n" +
				"provider's own identity (InjectedIdentity): a namespace user can act with\n" +
				"no more than their namespace gives them.",
			Rules: []rule{
				{
					Rule:      "!has(self.gcp) || self.gcp.credentials.source != 'InjectedIdentity'",
					Message:   "gcp.credentials.source InjectedIdentity is not allowed on a namespaced ProviderConfig: it would act with the provider's own Google identity; use source Secret with a service-account key in this namespace, or a ClusterProviderConfig the platform team provides",
					FieldPath: ".gcp.credentials.source",
				},
				{
					Rule:      "!has(self.gcp) || !has(self.gcp.endpoint)",
					Message:   "gcp.endpoint is not allowed on a namespaced ProviderConfig: the provider would send this config's tokens to it and report its answers from inside the cluster; a ClusterProviderConfig the platform team provides can set it",
					FieldPath: ".gcp.endpoint",
				},
				{
					Rule:      "!has(self.kubernetes) || self.kubernetes.credentials.source != 'InjectedIdentity'",
					Message:   "kubernetes.credentials.source InjectedIdentity is not allowed on a namespaced ProviderConfig: it would act with the provider's own service account; use source Secret with a kubeconfig in this namespace, or a ClusterProviderConfig the platform team provides",
					FieldPath: ".kubernetes.credentials.source",
				},
			},
		},
		{Name: "ClusterProviderConfig", Role: config, Scope: cluster, Spec: "ClusterProviderConfigSpec",
			Doc:     "A ClusterProviderConfig says where proxies of any namespace run and with\nwhich credentials.",
			SpecDoc: "ClusterProviderConfigSpec is a ProviderConfigSpec whose Secret refs name\ntheir namespace."},
		{Name: "ProviderConfigUsage", Role: usage, Scope: namespaced,
			Doc: "A ProviderConfigUsage records that a namespaced proxy uses a ProviderConfig\nor ClusterProviderConfig, so a config in use is not deleted."},
	}},
	{Dir: "cluster/v1alpha1", Kinds: []kind{
		{Name: "ProviderConfig", Role: config, Scope: cluster, Spec: "ProviderConfigSpec",
			Doc:     "A ProviderConfig says where cluster-scoped proxies run and with which\ncredentials.",
			SpecDoc: "ProviderConfigSpec is a ProviderConfigSpec whose Secret refs name their\nnamespace."},
		{Name: "ProviderConfigUsage", Role: usage, Scope: cluster,
			Doc: "A ProviderConfigUsage records that a cluster-scoped proxy uses a\nProviderConfig, so a config in use is not deleted."},
	}},
}

// secretRefs are the Secret references of a ProviderConfigSpec, under
// <block>.credentials: a cluster-scoped config names each one's namespace,
// a namespaced config none (it reads Secrets in its own namespace).
var secretRefs = []secretRef{
	{Block: "kvm", Ref: "sshKeySecretRef"},
	{Block: "kvm", Ref: "knownHostsSecretRef", Optional: true},
	{Block: "proxmox", Ref: "tokenSecretRef"},
	{Block: "proxmox", Ref: "caSecretRef", Optional: true},
	{Block: "gcp", Ref: "secretRef", Optional: true},
	{Block: "kubernetes", Ref: "secretRef", Optional: true},
}

// Printer columns, in kubectl's order: a proxy's are proxyColumns, then its
// row's Columns, then proxyWideColumns.
var (
	proxyColumns = []column{
		{Name: "READY", Type: "string", JSONPath: ".status.conditions[?(@.type=='Ready')].status"},
		{Name: "SYNCED", Type: "string", JSONPath: ".status.conditions[?(@.type=='Synced')].status"},
		{Name: "EXTERNAL-NAME", Type: "string", JSONPath: `.metadata.annotations.crossplane\\.io/external-name`},
		{Name: "IP", Type: "string", JSONPath: ".status.atProvider.ip"},
		{Name: "STATE", Type: "string", JSONPath: ".status.atProvider.state"},
		{Name: "EGRESS-IP", Type: "string", JSONPath: ".status.atProvider.egressIP"},
	}
	proxyWideColumns = []column{
		ageColumn,
		{Name: "CONFIG", Type: "string", JSONPath: ".spec.providerConfigRef.name", Priority: 1},
		{Name: "BACKEND-ID", Type: "string", JSONPath: ".status.atProvider.id", Priority: 1},
		{Name: "EGRESS-SOURCE", Type: "string", JSONPath: ".status.atProvider.egressIPSource", Priority: 1},
	}
	configColumns = []column{
		{Name: "BACKEND", Type: "string", JSONPath: ".status.backend"},
		{Name: "HEALTHY", Type: "string", JSONPath: ".status.conditions[?(@.type=='Healthy')].status"},
		{Name: "USERS", Type: "integer", JSONPath: ".status.users"},
		ageColumn,
	}
	usageColumns = []column{
		{Name: "CONFIG-NAME", Type: "string", JSONPath: ".providerConfigRef.name"},
		{Name: "RESOURCE-KIND", Type: "string", JSONPath: ".resourceRef.kind"},
		{Name: "RESOURCE-NAME", Type: "string", JSONPath: ".resourceRef.name"},
		ageColumn,
	}
	ageColumn = column{Name: "AGE", Type: "date", JSONPath: ".metadata.creationTimestamp"}
)
