// deploy/*.yaml: every object valid against the Kubernetes schemas (kubernetes-models' JSON-schema
// validators, offline) with no unknown field (client-node's type maps), least-privilege RBAC, and a
// DaemonSet whose ConfigMap, args, probes and mounts agree with the proxy itself.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import * as k8s from '@kubernetes/client-node';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { ClusterRole } from 'kubernetes-models/rbac.authorization.k8s.io/v1/ClusterRole';
import { ClusterRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1/ClusterRoleBinding';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { parseAllDocuments } from 'yaml';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { parseConfigFile } from '../../../src/config/file.ts';
import { parseArgs } from '../../../src/config/flags.ts';
import { parseHostPort } from '../../../src/lib/host-port.ts';

const DEPLOY = new URL('../../../deploy/', import.meta.url);
const VERSION = (
  JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string } } & Record<
  string,
  unknown
>;

const files = readdirSync(DEPLOY).filter((f) => /\.ya?ml$/.test(f));
const objects: { file: string; object: Obj }[] = [];
for (const file of files) {
  for (const doc of parseAllDocuments(readFileSync(new URL(file, DEPLOY), 'utf8'))) {
    assert.deepEqual(doc.errors, [], `${file}: YAML errors`);
    const object = doc.toJS() as Obj | null;
    if (object !== null) objects.push({ file, object });
  }
}

// The validators kubernetes-models generates from the Kubernetes OpenAPI schema, by apiVersion/kind.
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/ServiceAccount': ServiceAccount,
  'v1/ConfigMap': ConfigMap,
  'rbac.authorization.k8s.io/v1/ClusterRole': ClusterRole,
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': ClusterRoleBinding,
  'apps/v1/DaemonSet': DaemonSet,
};

type AttributeTypes = { baseName: string; type: string }[];
const models = k8s as unknown as Record<string, { getAttributeTypeMap?: () => AttributeTypes } | undefined>;

/** Paths of fields the API does not know (the schemas allow them; `kubectl apply` would warn or fail). */
function unknownFields(value: unknown, type: string, path: string): string[] {
  if (value === null || value === undefined) return [];
  const array = /^Array<(.+)>$/.exec(type);
  if (array) return (value as unknown[]).flatMap((v, i) => unknownFields(v, array[1]!, `${path}[${i}]`));
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (map)
    return Object.entries(value as object).flatMap(([k, v]) => unknownFields(v, map[1]!, `${path}.${k}`));
  const attributes = models[type]?.getAttributeTypeMap?.();
  if (attributes === undefined) return []; // string, number, IntOrString, ...
  return Object.entries(value as object).flatMap(([k, v]) => {
    const attribute = attributes.find((a) => a.baseName === k);
    return attribute === undefined ? [`${path}.${k}`] : unknownFields(v, attribute.type, `${path}.${k}`);
  });
}

test('deploy/ has the objects a DaemonSet install needs', () => {
  assert.ok(files.length > 0);
  assert.deepEqual(objects.map((o) => `${o.object.kind}/${o.object.metadata.name}`).sort(), [
    'ClusterRole/kube-userspace-proxy',
    'ClusterRoleBinding/kube-userspace-proxy',
    'ConfigMap/kube-userspace-proxy',
    'DaemonSet/kube-userspace-proxy',
    'ServiceAccount/kube-userspace-proxy',
  ]);
});

for (const { file, object } of objects) {
  const id = `${file}: ${object.kind}/${object.metadata?.name}`;
  test(`${id} is valid against the Kubernetes schema`, () => {
    const Model = MODELS[`${object.apiVersion}/${object.kind}`];
    assert.ok(Model, `no schema for ${object.apiVersion} ${object.kind}`);
    new Model(object as never).validate();
    const version = object.apiVersion.split('/').pop()!;
    const type = `${version[0]!.toUpperCase()}${version.slice(1)}${object.kind}`;
    assert.ok(models[type]?.getAttributeTypeMap, `no type map for ${type}`);
    assert.deepEqual(unknownFields(object, type, object.kind), []);
    const namespaced = object.kind !== 'ClusterRole' && object.kind !== 'ClusterRoleBinding';
    assert.equal(object.metadata.namespace, namespaced ? 'kube-system' : undefined);
  });
}

test('the schema check and the unknown-field check can fail', () => {
  const ds = find('DaemonSet') as unknown as { spec: { template: { spec: Record<string, unknown> } } };
  const broken = structuredClone(ds);
  broken.spec.template.spec['hostNetwrk'] = true;
  assert.deepEqual(unknownFields(broken, 'V1DaemonSet', 'DaemonSet'), [
    'DaemonSet.spec.template.spec.hostNetwrk',
  ]);
  broken.spec.template.spec['containers'] = [{ image: 'x' }];
  assert.throws(
    () => new DaemonSet(broken as never).validate(),
    /containers\/0 must have required property name/,
  );
});

function find(kind: string): Obj {
  const found = objects.find((o) => o.object.kind === kind);
  assert.ok(found, `no ${kind}`);
  return found.object;
}

test('RBAC is exactly the least-privilege set, bound to the ServiceAccount', () => {
  const role = find('ClusterRole') as Obj & { rules: k8s.V1PolicyRule[] };
  // Flattened to group/resource: verbs, so the order of rules and lists does not matter.
  const grants = role.rules
    .flatMap((r) =>
      (r.apiGroups ?? []).flatMap((g) =>
        (r.resources ?? []).map((res) => `${g || 'core'}/${res}: ${[...r.verbs].sort().join(',')}`),
      ),
    )
    .sort();
  assert.deepEqual(grants, [
    'core/events: create,patch',
    'core/nodes: get,list,watch',
    'core/services: list,watch',
    'discovery.k8s.io/endpointslices: list,watch',
    'events.k8s.io/events: create,patch',
  ]);
  assert.ok(role.rules.every((r) => r.resourceNames === undefined && r.nonResourceURLs === undefined));
  const binding = find('ClusterRoleBinding') as Obj & k8s.V1ClusterRoleBinding;
  const sa = find('ServiceAccount');
  assert.deepEqual(binding.roleRef, {
    apiGroup: 'rbac.authorization.k8s.io',
    kind: 'ClusterRole',
    name: role.metadata.name,
  });
  assert.deepEqual(binding.subjects, [
    { kind: 'ServiceAccount', name: sa.metadata.name, namespace: 'kube-system' },
  ]);
});

type DS = Obj & k8s.V1DaemonSet;

test('the ConfigMap holds a KubeProxyConfiguration the proxy loads with nothing ignored', () => {
  const cm = find('ConfigMap') as Obj & k8s.V1ConfigMap;
  const { config, ignored } = parseConfigFile(cm.data!['config.conf']!, 'config.conf');
  assert.deepEqual(ignored, []);
  assert.equal(config.healthzBindAddress, DEFAULT_CONFIG.healthzBindAddress);
  assert.equal(config.iptablesSyncPeriodMs, DEFAULT_CONFIG.iptablesSyncPeriodMs);
});

test('the DaemonSet: host network, node-critical, only NET_ADMIN and NET_RAW, rolling one node at a time', () => {
  const ds = find('DaemonSet') as DS;
  const spec = ds.spec!;
  const pod = spec.template.spec!;
  assert.deepEqual(spec.selector.matchLabels, spec.template.metadata?.labels);
  assert.deepEqual(spec.updateStrategy, { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1 } });
  assert.equal(pod.hostNetwork, true);
  assert.equal(pod.priorityClassName, 'system-node-critical');
  assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
  assert.equal(pod.serviceAccountName, find('ServiceAccount').metadata.name);
  assert.ok((pod.terminationGracePeriodSeconds ?? 0) * 1000 > DEFAULT_CONFIG.shutdownGracePeriodMs);
  assert.equal(pod.containers.length, 1);
  const c = pod.containers[0]!;
  assert.equal(c.image, `kube-userspace-proxy:${VERSION}`);
  assert.deepEqual(c.securityContext, {
    allowPrivilegeEscalation: false,
    capabilities: { drop: ['ALL'], add: ['NET_ADMIN', 'NET_RAW'] },
  });
  assert.equal(pod.securityContext, undefined);
  assert.ok(c.resources?.requests?.['cpu'] && c.resources.requests['memory']);
  assert.equal(c.resources?.limits, undefined);
});

test('the DaemonSet mounts what its args and probes use', async (t) => {
  const ds = find('DaemonSet') as DS;
  const pod = ds.spec!.template.spec!;
  const c = pod.containers[0]!;
  const volume = (name: string) => pod.volumes?.find((v) => v.name === name);
  const mount = (path: string) => c.volumeMounts?.find((m) => m.mountPath === path);

  // --config names config.conf of the ConfigMap, mounted read-only.
  const configArg = c.args?.find((a) => a.startsWith('--config='))?.slice('--config='.length);
  assert.ok(configArg, 'no --config');
  const dir = configArg.slice(0, configArg.lastIndexOf('/'));
  assert.equal(configArg.slice(dir.length + 1), 'config.conf');
  assert.equal(mount(dir)?.readOnly, true);
  assert.equal(volume(mount(dir)!.name)?.configMap?.name, find('ConfigMap').metadata.name);
  assert.deepEqual(volume(mount('/run/xtables.lock')!.name)?.hostPath, {
    path: '/run/xtables.lock',
    type: 'FileOrCreate',
  });
  assert.equal(mount('/lib/modules')?.readOnly, true);
  assert.equal(volume(mount('/lib/modules')!.name)?.hostPath?.path, '/lib/modules');

  // NODE_NAME from the downward API feeds --hostname-override.
  assert.ok(c.args?.includes('--hostname-override=$(NODE_NAME)'));
  assert.deepEqual(c.env?.find((e) => e.name === 'NODE_NAME')?.valueFrom, {
    fieldRef: { fieldPath: 'spec.nodeName' },
  });

  // The args parse, with the ConfigMap's file, to a config whose health server the probes reach.
  const tmp = await mkdtemp(join(tmpdir(), 'kup-deploy-'));
  t.after(() => rm(tmp, { recursive: true, force: true }));
  const file = join(tmp, 'config.conf');
  await writeFile(file, (find('ConfigMap') as Obj & k8s.V1ConfigMap).data!['config.conf']!);
  const args = c.args!.map((a) => a.replace(configArg, file).replace('$(NODE_NAME)', 'Node-A'));
  const { config, warnings } = await parseArgs(args);
  assert.deepEqual(warnings, []);
  assert.equal(config.hostnameOverride, 'node-a');
  const healthPort = parseHostPort(config.healthzBindAddress)!.port;
  assert.deepEqual(c.livenessProbe?.httpGet, { path: '/livez', port: healthPort });
  assert.deepEqual(c.readinessProbe?.httpGet, { path: '/healthz', port: healthPort });
  assert.deepEqual(c.ports, [{ name: 'healthz', containerPort: healthPort, protocol: 'TCP' }]);
});
