"""balancer.sim"""
