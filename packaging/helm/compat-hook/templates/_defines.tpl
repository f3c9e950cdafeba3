{{/*
The node's containerd as a JSON object: distribution, socket, config, root, namespace.
containerd.distribution=auto asks the cluster once (`helm install`; `helm template` finds nothing
and gives containerd): a node whose kubelet version carries +k3s or +rke2, or that microk8s
labelled, names the distribution.
*/}}
{{- define "compat-hook.containerd" -}}
{{- $c := .Values.containerd -}}
{{- $dist := $c.distribution -}}
{{- if eq $dist "auto" -}}
{{- $dist = "containerd" -}}
{{- $nodes := lookup "v1" "Node" "" "" -}}
{{- range $n := ((($nodes | default dict).items) | default list) -}}
{{- $v := (($n.status | default dict).nodeInfo | default dict).kubeletVersion | default "" -}}
{{- if contains "+k3s" $v -}}{{- $dist = "k3s" -}}
{{- else if contains "+rke2" $v -}}{{- $dist = "rke2" -}}
{{- else if hasKey (($n.metadata | default dict).labels | default dict) "microk8s.io/cluster" -}}{{- $dist = "microk8s" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $presets := dict
  "containerd" (dict "socket" "/run/containerd/containerd.sock" "config" "/etc/containerd/config.toml" "root" "/var/lib/containerd")
  "k3s" (dict "socket" "/run/k3s/containerd/containerd.sock" "config" "/var/lib/rancher/k3s/agent/etc/containerd/config.toml" "root" "/var/lib/rancher/k3s/agent/containerd")
  "rke2" (dict "socket" "/run/k3s/containerd/containerd.sock" "config" "/var/lib/rancher/rke2/agent/etc/containerd/config.toml" "root" "/var/lib/rancher/rke2/agent/containerd")
  "microk8s" (dict "socket" "/var/snap/microk8s/common/run/containerd.sock" "config" "/var/snap/microk8s/current/args/containerd-template.toml" "root" "/var/snap/microk8s/common/var/lib/containerd")
-}}
{{- $p := get $presets $dist -}}
{{- $socket := $c.socket | default .Values.agent.containerdSocket | default $p.socket -}}
{{- dict "distribution" $dist
      "socket" $socket
      "config" ($c.config | default $p.config)
      "root" (trimSuffix "/" ($c.root | default $p.root))
      "namespace" (.Values.agent.containerdNamespace | default $c.namespace | default "k8s.io")
    | toJson -}}
{{- end -}}

{{/* The agent's and the release Job's ServiceAccount user names, as the API server sees them. */}}
{{- define "compat-hook.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:compat-hook
{{- end -}}
{{- define "compat-hook.releaseUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:compat-hook-release
{{- end -}}
{{- define "compat-hook.validatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:compat-hook-validator
{{- end -}}
{{/* The ResourceClaimTemplate of the validator's probe pods (validator.deviceClass), the only claim
the admission policy lets them name. */}}
{{- define "compat-hook.probeClaimTemplate" -}}
compat-hook-probe-gpu
{{- end -}}

{{/*
What the schema cannot say plainly, checked here and refused at once, every bad value named (one
message): the label prefixes the agent writes under and the release Job removes under are never
nvidia.com, kubernetes.io, k8s.io or a subdomain of one, whose keys belong to the GPU Operator and to
Kubernetes (the admission policy would otherwise let every node's agent write them); and the rest the
agent and validator would refuse at their start (the same rules as the command line), also for values
that skip the schema.
*/}}
{{- define "compat-hook.checkValues" -}}
{{- $bad := list -}}
{{- range $i, $p := .Values.release.formerLabelPrefixes -}}
{{- if regexMatch "(^|\\.)(nvidia\\.com|kubernetes\\.io|k8s\\.io)$" (toString $p) -}}
{{- $bad = append $bad (printf "release.formerLabelPrefixes[%d]=%s is reserved (the GPU Operator's or Kubernetes' own keys)" $i $p) -}}
{{- end -}}
{{- end -}}
{{- if regexMatch "(^|\\.)(nvidia\\.com|kubernetes\\.io|k8s\\.io)$" (toString .Values.agent.labelPrefix) -}}
{{- $bad = prepend $bad (printf "agent.labelPrefix=%s is reserved (the GPU Operator's or Kubernetes' own keys)" .Values.agent.labelPrefix) -}}
{{- end -}}
{{- if not (regexMatch "^(containerd:.*|docker:.*|containers-storage:.*|(oci|oci-archive|docker-archive):.+|/.+)$" (toString .Values.agent.store)) -}}
{{- $bad = append $bad (printf "agent.store=%s is not an image source (containerd:, oci:DIR, oci-archive:FILE, docker-archive:FILE, docker:, containers-storage:)" (toString .Values.agent.store)) -}}
{{- end -}}
{{- if lt (float64 .Values.agent.interval) 1.0 -}}
{{- $bad = append $bad (printf "agent.interval=%v is below 1 (seconds)" .Values.agent.interval) -}}
{{- end -}}
{{- range $k, $low := dict "probeTimeout" 10 "deadline" 10 "parallel" 1 "retry" 1 -}}
{{- $v := index $.Values.validator $k -}}
{{- if lt (float64 $v) (float64 $low) -}}
{{- $bad = append $bad (printf "validator.%s=%v is below %v" $k $v $low) -}}
{{- end -}}
{{- end -}}
{{- if $bad -}}
{{- fail (printf "bad values: %s" (join "; " $bad)) -}}
{{- end -}}
{{- end -}}

{{/* The release Job's account and grant: pre-delete hooks made before the Job (weight 0). */}}
{{- define "compat-hook.releaseHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: "-10"
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* Whether the fleet controller runs ("true" or ""): fleet.enabled, where "auto" (the default) follows
     agent.gate, so the cluster enforces the runbook's order wherever compat-hook holds upgrades. */}}
{{- define "compat-hook.fleet" -}}
{{- $on := .Values.fleet.enabled -}}
{{- if eq (toString $on) "auto" -}}{{- $on = .Values.agent.gate -}}{{- end -}}
{{- if and .Values.agent.enabled $on -}}true{{- end -}}
{{- end -}}

{{/* Whether the driver-version policy is rendered ("true" or ""): with the fleet; "auto" leaves it out
     where admissionPolicy.enabled=false (Kubernetes < 1.30), an explicit fleet.enabled=true fails there. */}}
{{- define "compat-hook.fleetAdmission" -}}
{{- if and (include "compat-hook.fleet" .) .Values.fleet.admission -}}
{{- if or .Values.admissionPolicy.enabled (ne (toString .Values.fleet.enabled) "auto") -}}true{{- end -}}
{{- end -}}
{{- end -}}
