//go:build linux

package controlplane

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func (n *Node) startKubelet() error {
	u, err := n.c.env.ControlPlane.AddUser(envtest.User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}}, nil)
	if err != nil {
		return err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return err
	}
	d := filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return err
	}
	kcPath := filepath.Join(n.pki, "kubelet.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1: kubelet 1.35 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
# Names of its own, apart from another kubelet's on this machine: pods'
# cgroups below /egressproxy-node, their logs in the node's folder (a
# kubelet removes the log folders of pods it does not know), no iptables
# chains of the kubelet's (another kubelet's have the same names).
cgroupRoot: /%[7]s
podLogsDir: %[8]q
volumePluginDir: %[9]q
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[5]q}
authorization:
  mode: AlwaysAllow
podCIDR: %[6]s
failSwapOn: false
registerNode: true
serializeImagePulls: false
# Never collect the imported images: they cannot be pulled again.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
# Secret updates and pod restarts within seconds, not a minute.
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
resolvConf: ""
staticPodPath: ""
rotateCertificates: false
serverTLSBootstrap: false
`, n.ContainerdSocket, n.Gateway, n.ports.kubelet, n.ports.kubeletHealthz,
		filepath.Join(n.pki, "kubelet-client-ca.crt"), n.PodCIDR, nodeCgroup, filepath.Join(d, "pod-logs"), filepath.Join(d, "volume-plugins"))
	confPath := filepath.Join(d, "config.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	_, err = n.run("kubelet", filepath.Join(n.BinDir, "kubelet"), []string{
		"--config=" + confPath,
		"--kubeconfig=" + kcPath,
		"--root-dir=" + filepath.Join(d, "root"),
		"--cert-dir=" + filepath.Join(d, "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.Gateway.String(),
		"--v=1",
	}, nil)
	return err
}

func (n *Node) startScheduler() error {
	kc, err := n.userKubeconfig("system:kube-scheduler", "kube-scheduler.kubeconfig")
	if err != nil {
		return err
	}
	_, err = n.run("kube-scheduler", filepath.Join(n.BinDir, "kube-scheduler"), []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	}, nil)
	return err
}

func (n *Node) startKubeProxy() error {
	kc, err := n.userKubeconfig("system:kube-proxy", "kube-proxy.kubeconfig")
	if err != nil {
		return err
	}
	// iptables mode, touching nothing machine-wide it can leave alone:
	// conntrack limits and timeouts as they are, NodePorts only on the
	// bridge (so no route_localnet).
	conf := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %[1]q
hostnameOverride: %[2]s
bindAddress: %[3]s
clusterCIDR: %[4]s
healthzBindAddress: 127.0.0.1:%[5]d
metricsBindAddress: 127.0.0.1:%[6]d
nodePortAddresses: [%[4]s]
iptables:
  localhostNodePorts: false
  syncPeriod: 10s
  minSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, kc, n.Name, n.Gateway, n.PodCIDR, n.ports.proxyHealthz, n.ports.proxyMetrics)
	p := filepath.Join(n.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		return err
	}
	_, err = n.run("kube-proxy", filepath.Join(n.BinDir, "kube-proxy"), []string{"--config=" + p, "--v=1"}, nil)
	return err
}

// userKubeconfig writes a kubeconfig of a client certificate for user (the
// bootstrap RBAC bindings of kube-scheduler and kube-proxy name them).
func (n *Node) userKubeconfig(user, file string) (string, error) {
	u, err := n.c.env.ControlPlane.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	p := filepath.Join(n.pki, file)
	return p, os.WriteFile(p, kc, 0o600)
}
