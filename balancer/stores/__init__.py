"""balancer.stores"""
